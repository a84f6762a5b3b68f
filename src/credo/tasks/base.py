"""What a task is: problems with a prompt and a gold answer, a verifier, and (optionally) step truth.

Tasks also own everything that depends on the answer format, so estimators stay task-agnostic:
how to extract an answer, the forced-answer probe template (RREDCoT), and how a reference
solution is placed before a prompt (SC-GRPO's teacher context). Optional hook:
`reference_solution(problem) -> list[str] | None`, a worked solution as step pieces whose
concatenation is a correct completion (RREDCoT's and the value localiser's reference tail).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from credo.core.rollouts import Prompt


HELDOUT_SEED = 20_261_130  # the seed of every generated task's fixed held-out sequence (the same on every machine)
VALIDATION_SEED = 20_261_203  # the seed of a generated task's fixed validation sequence (training-split problems)


def in_heldout_split(key: str, permille: int) -> bool:
    """Whether a problem belongs to the held-out split: the first 4 bytes of sha256(key) mod 1000 fall below
    `permille`, so the split depends on the problem alone (disjoint from training by construction)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % 1000 < permille


@dataclass(frozen=True)
class Problem:
    """One problem. `key` identifies it (for splits, caching); `data` holds task-specific fields."""

    key: str
    prompt: str
    answer: str
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class StepTruth:
    """Per-step truth of one completion: `correct[k]` for each step line, and the first wrong step
    (None when every step is right and the solution is complete; == len(correct) when the solution
    stops before its answer)."""

    correct: tuple[bool, ...]
    first_error: int | None


class Task(Protocol):
    name: str
    has_step_labels: bool
    default_segmenter: str  # the segmenter its completions are cut by (credo.core.segment): lines, keyword_entropy, ...
    system_prompt: str | None  # the answer format a chat policy is told in its system turn (credo.policy.bind_task)

    def train_problems(self, n: int, generator: torch.Generator) -> list[Problem]: ...
    def heldout_problems(self, n: int) -> list[Problem]: ...
    def solution(self, problem: Problem) -> str: ...
    def extract_answer(self, completion: str) -> str | None: ...
    def is_correct(self, problem: Problem, completion: str) -> bool: ...
    def check_answer(self, problem: Problem, answer: str) -> bool: ...
    def reward(self, problem: Problem, completion: str) -> float: ...
    def step_truth(self, problem: Problem, completion: str) -> StepTruth | None: ...
    def answer_probe(self, answer: str) -> tuple[str, str]: ...
    def reference_prompt(self, problem: Problem, reference_solution: str) -> str | Prompt: ...
    # a str is a user turn; a Prompt also carries system-turn text (the policy renders either)


def rewards_for(task: Task, problems: Sequence[Problem],
                completions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards[B] float, correct[B] bool) from the task's verifier."""
    correct = torch.tensor([task.is_correct(p, c) for p, c in zip(problems, completions)], dtype=torch.bool)
    rewards = torch.tensor([task.reward(p, c) for p, c in zip(problems, completions)], dtype=torch.float32)
    return rewards, correct
