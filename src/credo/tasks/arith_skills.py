"""SFT examples that teach the tiny arith policy SRPO's self-localisation and SC-GRPO's reading of a solution in
its context (docs/methods.md, "## Premise checks").

A localisation example is the task's own localisation request (`ArithTask.localisation_prompt`, exactly
what the `prompt` localiser sends at training time) about a trace, with the target `Step k`, k the
trace's labelled first wrong step by the task's step truth (`Step 0` for a trace without a wrong step).
Wrong traces are synthetic: the worked solution with one line corrupted, every later line carrying the
corrupted value forward correctly (so, by the step-truth rule, the corrupted line is the first and only
error, as in the policy's own slips). The corrupted line is uniform over the trace's lines, so the
labels are not biased to any position.
"""

from __future__ import annotations

import random

from credo.tasks.arith import LOCALISATION_STEP, ArithTask
from credo.tasks.base import apply_op
from credo.core.protocols import Problem

CORRUPTIONS = ("result", "result", "result", "operand", "carry")
"""Kinds of slip, drawn uniformly from this tuple: a wrong result (3 in 5), a miscopied operand, a wrong
carried value (the left operand differs from the line before)."""


def corrupted_lines(task: ArithTask, problem: Problem, line: int, rng: random.Random) -> list[str]:
    """The worked solution's lines with line `line` (0-based; the last is the `#### N` answer line) wrong
    and the lines after it carrying its value forward. Values never go below zero (a step line's left
    operand has no sign in this task's format): a draw that would is redrawn, and the last try is an
    upward wrong result, which never does."""
    terms, ops = problem.data["terms"], problem.data["ops"]
    for attempt in range(MAX_TRIES):
        last = attempt == MAX_TRIES - 1
        kind, sign = ("result", 1) if last else (rng.choice(CORRUPTIONS), rng.choice((-1, 1)))
        lines, total, ok = [], terms[0], True
        for k, (op, operand) in enumerate(zip(ops, terms[1:])):
            left, right, result = total, operand, apply_op(total, op, operand)
            if k == line:
                left, right, result = _slip(kind, left, op, right, result, sign, rng)
            lines.append(f"{left}{op}{right}={result}")
            total = result
            ok = ok and min(left, right, result) >= 0
        answer = total + sign * rng.randint(1, 3) if line == len(ops) else total
        if ok and answer >= 0:
            return lines + [f"#### {answer}"]
    raise AssertionError("an upward slip never goes below zero")


MAX_TRIES = 8


def _slip(kind: str, left: int, op: str, right: int, result: int, sign: int,
          rng: random.Random) -> tuple[int, int, int]:
    """(left, right, result) of a wrong line of `kind` (one of CORRUPTIONS), moved by `sign`."""
    if kind == "operand":
        wrong = rng.choice([d for d in range(10) if d != right])
        return left, wrong, apply_op(left, op, wrong)
    if kind == "carry":
        wrong = left + sign * rng.randint(1, 3)
        return wrong, right, apply_op(wrong, op, right)
    return left, right, result + sign * rng.randint(1, 3)


def localisation_example(task: ArithTask, problem: Problem, rng: random.Random, right_share: float) -> tuple[str, str]:
    """(request, target) of one localisation example: a right trace with probability `right_share`, else one
    corrupted at a uniform line; the target is `Step k` from the task's step truth (module docstring)."""
    lines = task.solution_lines(problem)
    if rng.random() >= right_share:
        lines = corrupted_lines(task, problem, rng.randrange(len(lines)), rng)
    steps = [line + "\n" for line in lines[:-1]] + lines[-1:]  # the `lines` segments of the trace
    first = task.step_truth(problem, "".join(steps)).first_error
    target = LOCALISATION_STEP.format(0 if first is None else first + 1)
    return task.localisation_prompt(problem, steps), target


def scrambled_solution(problem: Problem, rng: random.Random) -> str:
    """A solution in the task's format whose results are random (each line's left operand carries the previous
    random result forward, as a worked solution does): a text only copying can predict, for the `copy` examples
    (a scrambled solution in the teacher's context -> that same text), which teach the teacher to read its
    context instead of computing past it. Each result is drawn uniformly among the numbers with no more digits
    than the true result of that line, so the text is never longer than the worked solution and the example
    fits wherever a reference example does."""
    terms, ops = problem.data["terms"], problem.data["ops"]
    lines, total, true = [], terms[0], terms[0]
    for op, operand in zip(ops, terms[1:]):
        true = apply_op(true, op, operand)
        value = rng.randint(0, 10 ** len(str(true)) - 1)  # a result's sign is never written: values stay >= 0
        lines.append(f"{total}{op}{operand}={value}")
        total = value
    return "\n".join(lines + [f"#### {total}"])
