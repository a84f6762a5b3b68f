"""Tasks by name: `arith` and `arith-long` (built in, with step truth); more backends register here."""

from __future__ import annotations

from typing import Any

from credo.core.config import ConfigError, from_dict, merge, to_dict
from credo.tasks.arith import PRESETS as ARITH_PRESETS
from credo.tasks.arith import ArithConfig, ArithTask
from credo.tasks.base import Problem, StepTruth, Task, rewards_for  # noqa: F401


def make_task(name: str, options: dict[str, Any] | None = None, prefix: str = "task.") -> Task:
    """Build a task from its name and option mapping (errors name the offending field, under `prefix`)."""
    options = dict(options or {})
    if name in ARITH_PRESETS:
        return ArithTask(from_dict(ArithConfig, merge(to_dict(ARITH_PRESETS[name]), options), prefix=prefix), name)
    if name.startswith("gym:"):
        from credo.tasks.gym import GymTask
        return GymTask(name[4:], options)
    if name.startswith("jsonl:"):
        from credo.tasks.jsonl import JsonlOptions, JsonlTask
        return JsonlTask(name[6:], from_dict(JsonlOptions, options, prefix=prefix))
    raise ConfigError(f"unknown task {name!r}; available: {', '.join(ARITH_PRESETS)}, gym:<reasoning-gym "
                      "dataset>, jsonl:<path>")
