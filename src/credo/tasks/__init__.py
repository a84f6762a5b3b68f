"""Tasks by name: `arith` (built in, with step truth); more backends register here."""

from __future__ import annotations

from typing import Any

from credo.config import from_dict
from credo.tasks.arith import ArithConfig, ArithTask
from credo.tasks.base import Problem, StepTruth, Task, rewards_for  # noqa: F401


def make_task(name: str, options: dict[str, Any] | None = None) -> Task:
    """Build a task from its name and option mapping (errors name the offending field)."""
    if name == "arith":
        return ArithTask(from_dict(ArithConfig, dict(options or {}), prefix="task."))
    raise ValueError(f"unknown task {name!r}; available: arith")
