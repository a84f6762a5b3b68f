"""SFT examples that teach a chat model SRPO's self-localisation and SC-GRPO's reading of a solution in its
context, on reasoning-gym's +/- chains with step labels (`gym:chain_sum` with `task_options.step_labels=true`);
the tiny arith policy's counterpart is credo.tasks.arith_skills (docs/methods.md, "## Premise checks").

A localisation example is the task's own localisation request (`task.localisation_prompt`, sent as a bare user
turn, exactly what the `prompt` localiser sends at training time) about a wrong trace, with the target
`\\boxed{k}`, k the trace's labelled first wrong step (1-based, as the request asks and `parse_step` reads it).
Wrong traces are synthetic: the running-sum solution with one line corrupted (a wrong result, a miscopied term
or a wrong carried value), every later line carrying the corrupted value forward correctly, so by the step
truth the corrupted line is the first and only error, as in the policy's own slips. The corrupted line is
uniform over the trace's lines, the answer line included, so the labels favour no position. Only wrong traces
are taught: the request tells the model the chain is wrong, and the localiser only ever sends wrong ones.
"""

from __future__ import annotations

import random

from credo.tasks.arith_skills import CORRUPTIONS  # the same kinds of slip, in the same proportions
from credo.core.protocols import Problem
from credo.tasks.gym import chain


def corrupted_trace(task, problem: Problem, line: int, rng: random.Random) -> str:  # noqa: ANN001
    """The completion (running-sum lines, then the task's answer marker and answer) with line `line` wrong
    (0-based; line len(ops) is the answer line) and the lines after it carrying its value forward."""
    terms, ops = chain(task.expression(problem))
    kind, shift = rng.choice(CORRUPTIONS), rng.choice((-1, 1)) * rng.randint(1, 3)
    lines, total = [], terms[0]
    for k, (op, term) in enumerate(zip(ops, terms[1:])):
        left, right = total, term
        if k == line and kind == "carry":
            left = total + shift
        if k == line and kind == "operand":
            right = term + shift
        result = left + right if op == "+" else left - right
        if k == line and kind == "result":
            result += shift
        lines.append(f"{left} {op} {right} = {result}")
        total = result
    answer = total + shift if line == len(ops) else total
    marker, text = task.answer_probe(str(answer))
    return "\n".join(lines) + marker + text


def localisation_example(task, problem: Problem, rng: random.Random) -> tuple[str, str]:  # noqa: ANN001
    """(request, target) of one localisation example: a trace corrupted at a uniform line (module docstring),
    cut into its lines as the `lines` segmenter cuts a completion; the target is `\\boxed{k}` from the task's
    step truth."""
    _, ops = chain(task.expression(problem))
    completion = corrupted_trace(task, problem, rng.randrange(len(ops) + 1), rng)
    steps = completion.splitlines(keepends=True)
    first = task.step_truth(problem, completion).first_error
    return task.localisation_prompt(problem, steps), "\\boxed{" + str(first + 1) + "}"
