"""The protocols the library's base reads, and the helpers that go with them: a model backend (`Policy`, what it
samples with and returns: `SamplingConfig`, `Samples`, `left_pad`) and a task (`Task`, `Problem`, `StepTruth`,
`rewards_for`). The backends implementing them live in credo.policy, the tasks in credo.tasks; core reads only
these names, so it sits below both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from credo.core.rollouts import Prompt


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are drawn."""

    temperature: float = 1.0
    """Softmax temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 = all)."""
    max_new_tokens: int = 96
    """Generation limit per completion, in tokens."""


@dataclass
class Samples:
    """completion_ids[B, T] (right-padded, EOS kept), completion_mask[B, T] bool,
    logprobs[B, T]: log-prob of each sampled token under the untempered policy (0 on padding)."""

    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor


class Policy(Protocol):
    """What trainers, strategies and probes need from a model backend (tiny.TinyPolicy, hf.HFPolicy)."""

    device: torch.device
    model: torch.nn.Module
    pad_id: int
    eos_id: int
    system_prompt: str | None  # a chat backend's system turn before every prompt (the bound task's); others: None

    def encode_prompts(self, texts: Sequence[str | Prompt],
                       system: bool = True) -> tuple[torch.Tensor, torch.Tensor]: ...
    def encode_completions(self, texts: Sequence[str], eos: bool = True) -> tuple[torch.Tensor, torch.Tensor]: ...
    def encode_continuation(self, text: str, eos: bool = False) -> list[int]: ...
    def decode(self, ids: torch.Tensor) -> str: ...
    def token_strings(self, ids: Sequence[int]) -> list[str]: ...
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator) -> Samples: ...
    def score(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
              completion_mask: torch.Tensor, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]: ...
    def completion_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                          completion_mask: torch.Tensor) -> torch.Tensor: ...
    def score_branches(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                       completion_mask: torch.Tensor, branches: Sequence[tuple[int, int, Sequence[int]]],
                       reuse_prefix: bool = True) -> tuple[list[torch.Tensor], int]: ...
    def save(self, directory: str) -> None: ...
    def save_into(self, directory: str) -> None: ...
    def load_weights_from(self, directory: str) -> None: ...
    def copy(self) -> "Policy": ...


def left_pad(rows: Sequence[Sequence[int]], pad_id: int,
             device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Lists of ids -> (ids[B, L] left-padded, mask[B, L] bool)."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = True
    return ids.to(device), mask.to(device)


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
    first_slip: str | None = None
    """What went wrong at the first wrong step, where the task can tell (credo.tasks.base.SLIPS): a wrong
    result, a miscopied operand, a wrong carried value, an unreadable line, a wrong answer line, text after the
    answer, or a missing line; None for a right trace or a task that does not say."""


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
