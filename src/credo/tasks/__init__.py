"""Tasks by name, one registry (TASKS): `arith` and `arith-long` (built in, with step truth), `gym:<dataset>`
(reasoning-gym) and `jsonl:<path>` (math-verify). A task family is a maker `(argument, options, prefix) -> Task`
registered with `@TASKS.register(name, description)`; a family that takes an argument is registered as
'family:<argument>' and named 'family:value' (`make_task("gym:chain_sum")`)."""

from __future__ import annotations

from typing import Any

from credo.core.config import from_dict, merge, to_dict
from credo.core.registry import Registry
from credo.tasks.arith import PRESETS as ARITH_PRESETS
from credo.tasks.arith import ArithConfig, ArithTask
from credo.core.protocols import Problem, StepTruth, Task, rewards_for  # noqa: F401

TASKS = Registry("task")


def _arith_preset(name: str) -> Any:
    def make(_: str, options: dict, prefix: str) -> Task:
        return ArithTask(from_dict(ArithConfig, merge(to_dict(ARITH_PRESETS[name]), options), prefix=prefix), name)
    return make


for _name in ARITH_PRESETS:
    TASKS.register(_name, f"stepwise arithmetic with step truth ({_name} preset)")(_arith_preset(_name))


@TASKS.register("gym:<dataset>", "a reasoning-gym dataset, verified by its own scorer")
def _gym(dataset: str, options: dict, prefix: str) -> Task:
    from credo.tasks.gym import GymTask  # reasoning-gym loads only when a gym task is asked for
    return GymTask(dataset, options)


@TASKS.register("jsonl:<path>", "questions and answers from a JSONL file, verified by math-verify")
def _jsonl(path: str, options: dict, prefix: str) -> Task:
    from credo.tasks.jsonl import JsonlOptions, JsonlTask  # math-verify loads only when a jsonl task is asked for
    return JsonlTask(path, from_dict(JsonlOptions, options, prefix=prefix))


def make_task(name: str, options: dict[str, Any] | None = None, prefix: str = "task.") -> Task:
    """Build a task from its name and option mapping (errors name the offending field, under `prefix`); an
    unknown name is a ConfigError listing the registered ones."""
    family, colon, argument = name.partition(":")
    key = next((k for k in TASKS.names() if colon and k.startswith(family + ":")), name)
    return TASKS.get(key).fn(argument, dict(options or {}), prefix)
