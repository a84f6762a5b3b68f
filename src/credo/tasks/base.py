"""What the tasks share: the fixed seeds, the held-out split, and the step truth of a running-sum solution (its
lines judged, each first error's kind: SLIPS). What a task is (the `Task` protocol: problems with a
prompt and a gold answer, a verifier, and optionally step truth) is credo.core.protocols.

Tasks also own everything that depends on the answer format, so estimators stay task-agnostic:
how to extract an answer, the forced-answer probe template (RREDCoT), and how a reference
solution is placed before a prompt (SC-GRPO's teacher context). Optional hook:
`reference_solution(problem) -> list[str] | None`, a worked solution as step pieces whose
concatenation is a correct completion (RREDCoT's and the value localiser's reference tail).
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable

from credo.core.protocols import StepTruth

SLIPS = ("result", "operand", "operator", "carry", "early answer", "unreadable", "answer", "extra", "missing")
"""The kinds of a running-sum solution's first wrong line (StepTruth.first_slip), in the order reports list them:
a wrong result (the sum must be checked to see it), a miscopied operand or operator (the problem's first term on
the first line included), a wrong carried value (the line before's), an answer written before the last step, a
line that reads as neither, a wrong answer line, text after the answer line, a missing line. A localiser's top-1
is split by them: a wrong result needs the sum checked; an operand or a carried value only a copy."""


INTEGER = re.compile(r"^-?\d+$")


def apply_op(left: int, op: str, right: int) -> int:
    """`left op right` for a running sum's operators (+, -, *)."""
    return left + right if op == "+" else left - right if op == "-" else left * right


def running_sum_truth(lines: list[str], terms: list[int], ops: list[str], step: re.Pattern[str],
                      read_answer: Callable[[str], str | None]) -> StepTruth:
    """Which `lines` of a running-sum solution of `terms` joined by `ops` are right: line k (k < len(ops)) must
    read, by `step` (groups: left, op, right, result), as "previous op term_k+1 = result" with the value the
    line before wrote (so an error is counted once, where it is made), and the line after them must give the
    last value as its answer (`read_answer(line)`: the answer text of an answer line, None for any other line);
    anything after it, or a missing line, is an error. With each first error's kind (running_sum_slip)."""
    correct: list[bool] = []
    slips: list[str] = []  # the kind of each line's error ("" where it is right)
    previous: int | None = terms[0]
    for k, line in enumerate(lines):
        if k < len(ops):
            match = step.match(line)
            parsed = (int(match.group(1)), match.group(2), int(match.group(3)), int(match.group(4))) \
                if match else None
            ok = parsed is not None and (previous is None or parsed[0] == previous) and parsed[1] == ops[k] \
                and parsed[2] == terms[k + 1] and parsed[3] == apply_op(*parsed[:3])
            slips.append("" if ok else running_sum_slip(parsed, previous, ops[k], terms[k + 1], k == 0,
                                                        read_answer(line) is not None))
            previous = parsed[3] if parsed else None
        elif k == len(ops):
            answer = read_answer(line)
            ok = previous is not None and answer is not None and INTEGER.match(answer) is not None \
                and int(answer) == previous
            slips.append("" if ok else "answer")
        else:
            ok = False  # anything after the answer line is an error
            slips.append("extra")
        correct.append(ok)
    return StepTruth(tuple(correct), *first_error_and_slip(correct, slips, len(ops)))


def running_sum_slip(parsed: tuple[int, str, int, int] | None, previous: int | None, op: str, term: int,
                     first_line: bool, early_answer: bool) -> str:
    """The kind of a wrong running-sum line `left op right = result` (`parsed`; None: the line does not read
    as one, `early_answer` when it is an answer line) that should have been `previous op term`: a wrong left
    value (on the first line a miscopied operand, the problem's first term; after it a wrong carried value),
    then a miscopied operator or operand, else a wrong result."""
    if parsed is None:
        return "early answer" if early_answer else "unreadable"
    left, written_op, right, _ = parsed
    if previous is not None and left != previous:
        return "operand" if first_line else "carry"
    if written_op != op:
        return "operator"
    return "operand" if right != term else "result"


def first_error_and_slip(correct: list[bool], slips: list[str], n_steps: int) -> tuple[int | None, str | None]:
    """(first wrong line, its kind) of a running-sum solution whose lines were judged `correct[k]` with the
    kind `slips[k]` of each wrong one; a solution that stops before its answer line misses the next line."""
    if False in correct:
        k = correct.index(False)
        return k, slips[k]
    if len(correct) < n_steps + 1:
        return len(correct), "missing"
    return None, None


HELDOUT_SEED = 20_261_130  # the seed of every generated task's fixed held-out sequence (the same on every machine)
VALIDATION_SEED = 20_261_203  # the seed of a generated task's fixed validation sequence (training-split problems)


def in_heldout_split(key: str, permille: int) -> bool:
    """Whether a problem belongs to the held-out split: the first 4 bytes of sha256(key) mod 1000 fall below
    `permille`, so the split depends on the problem alone (disjoint from training by construction)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % 1000 < permille
