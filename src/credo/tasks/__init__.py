"""Tasks by name: `arith` (built in, with step truth); more backends register here."""

from __future__ import annotations

from typing import Any

from credo.config import from_dict
from credo.tasks.arith import ArithConfig, ArithTask
from credo.tasks.base import Problem, StepTruth, Task, rewards_for  # noqa: F401


def make_task(name: str, options: dict[str, Any] | None = None) -> Task:
    """Build a task from its name and option mapping (errors name the offending field)."""
    options = dict(options or {})
    if name == "arith":
        return ArithTask(from_dict(ArithConfig, options, prefix="task."))
    if name.startswith("gym:"):
        from credo.tasks.gym import GymTask
        return GymTask(name[4:], options)
    if name.startswith("jsonl:"):
        from credo.tasks.jsonl import JsonlTask
        unknown = set(options) - {"skip_bad_rows", "heldout_permille"}
        if unknown:
            raise ValueError(f"unknown task option(s) for jsonl: {', '.join(sorted(unknown))} (known: skip_bad_rows, heldout_permille)")
        return JsonlTask(name[6:], **options)
    raise ValueError(f"unknown task {name!r}; available: arith, gym:<reasoning-gym dataset>, jsonl:<path>")
