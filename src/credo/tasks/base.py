"""What the tasks share: the fixed seeds and the held-out split. What a task is (the `Task` protocol: problems with a
prompt and a gold answer, a verifier, and optionally step truth) is credo.core.protocols.

Tasks also own everything that depends on the answer format, so estimators stay task-agnostic:
how to extract an answer, the forced-answer probe template (RREDCoT), and how a reference
solution is placed before a prompt (SC-GRPO's teacher context). Optional hook:
`reference_solution(problem) -> list[str] | None`, a worked solution as step pieces whose
concatenation is a correct completion (RREDCoT's and the value localiser's reference tail).
"""

from __future__ import annotations

import hashlib

HELDOUT_SEED = 20_261_130  # the seed of every generated task's fixed held-out sequence (the same on every machine)
VALIDATION_SEED = 20_261_203  # the seed of a generated task's fixed validation sequence (training-split problems)


def in_heldout_split(key: str, permille: int) -> bool:
    """Whether a problem belongs to the held-out split: the first 4 bytes of sha256(key) mod 1000 fall below
    `permille`, so the split depends on the problem alone (disjoint from training by construction)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % 1000 < permille
