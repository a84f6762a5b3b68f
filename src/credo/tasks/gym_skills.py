"""SFT examples that teach a chat model SRPO's self-localisation and SC-GRPO's reading of a solution in its
context, on reasoning-gym's +/- chains with step labels (`gym:chain_sum` with `task_options.step_labels=true`);
the tiny arith policy's counterpart is credo.tasks.arith_skills (docs/methods.md, "## Premise checks").

A localisation example is the task's own localisation request (`task.localisation_prompt`, sent as a bare user
turn, exactly what the `prompt` localiser sends at training time) about a wrong trace, with the target
`\\boxed{k}`, k the trace's labelled first wrong step (1-based, as the request asks and `parse_step` reads it).
With reply="checks" the target first re-checks each step up to that one, a line each (`Step 2: 7 - 2 = 6: wrong,
7 - 2 = 5`), so that naming the step copies the first verdict that says wrong instead of counting to it; the
`prompt` localiser reads the last `\\boxed{k}` of either reply.
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


REPLIES = ("boxed", "checks")
"""The localisation targets: the bare `\\boxed{k}`, or each step re-checked up to the first wrong one, then it."""


def localisation_example(task, problem: Problem, rng: random.Random,  # noqa: ANN001
                         reply: str = "boxed") -> tuple[str, str]:
    """(request, target) of one localisation example: a trace corrupted at a uniform line (module docstring),
    cut into its lines as the `lines` segmenter cuts a completion; the target is `\\boxed{k}` from the task's
    step truth, after the step checks with reply="checks"."""
    _, ops = chain(task.expression(problem))
    completion = corrupted_trace(task, problem, rng.randrange(len(ops) + 1), rng)
    steps = completion.splitlines(keepends=True)
    first = task.step_truth(problem, completion).first_error
    boxed = "\\boxed{" + str(first + 1) + "}"
    if reply == "checks":
        return task.localisation_prompt(problem, steps), step_checks(task, problem, steps, first) + boxed
    return task.localisation_prompt(problem, steps), boxed


def step_checks(task, problem: Problem, steps: list[str], first: int) -> str:  # noqa: ANN001
    """One line per step of the running-sum trace `steps` up to `first` (0-based, its first wrong step): what
    the step should say, from the problem's terms and the value the step before it wrote, and whether it does
    (`Step 1: 4 + 3 = 7: right`; a wrong one names what it should be). The answer line is checked against the
    last line's value."""
    terms, ops = chain(task.expression(problem))
    out, total = [], terms[0]
    for k in range(first + 1):
        line = steps[k].strip()
        if k == len(ops):  # the answer line
            verdict = "right" if k != first else f"wrong, the last step gives {total}"
            out.append(f"Step {k + 1}: {line}: {verdict}")
            break
        left, op, right, _, result = line.split()[:5]
        should = total + terms[k + 1] if ops[k] == "+" else total - terms[k + 1]
        if k < first:
            out.append(f"Step {k + 1}: {line}: right")
        elif int(left) != total:
            out.append(f"Step {k + 1}: {line}: wrong, the previous value is {total}")
        elif int(right) != terms[k + 1] or op != ops[k]:
            out.append(f"Step {k + 1}: {line}: wrong, the problem has {ops[k]} {terms[k + 1]}")
        else:
            out.append(f"Step {k + 1}: {line}: wrong, {left} {op} {right} = {should}")
        total = int(result)
    return "\n".join(out) + "\n"
