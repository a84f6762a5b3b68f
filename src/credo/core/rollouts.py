"""The batch structures that flow through credo: Rollouts in, Credit out, Cost counted.

Layout follows TRL's convention so integrations can hand batches over without copies:
prompts are *left*-padded (`prompt_ids[B, P]`), completions are *right*-padded
(`completion_ids[B, T]`). Every per-token tensor is aligned with `completion_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch


@dataclass(frozen=True)
class Prompt:
    """A prompt as a task states it: the user turn, and text that belongs in the system turn (e.g. SC-GRPO's
    verified reference solution). The policy renders it: a chat backend puts `system` (after its bound
    task system prompt) in the system message; a plain backend writes `system`, a blank line, then `user`."""

    user: str
    system: str | None = None


@dataclass
class Cost:
    """Model work spent by an estimator or strategy, in tokens.

    tokens_scored: tokens pushed through a forward pass without sampling (teacher forcing, probes).
    tokens_generated: tokens sampled autoregressively (continuations, repairs, resets).
    """

    tokens_scored: int = 0
    tokens_generated: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.tokens_scored + other.tokens_scored, self.tokens_generated + other.tokens_generated)

    def as_dict(self) -> dict[str, int]:
        return {"tokens_scored": self.tokens_scored, "tokens_generated": self.tokens_generated}


@dataclass
class Rollouts:
    """A batch of B sampled completions, grouped by prompt.

    Tensors (all on the same device):
        prompt_ids[B, P]        long, left-padded prompt tokens
        prompt_mask[B, P]       bool, True on real prompt tokens
        completion_ids[B, T]    long, right-padded completion tokens (EOS included when emitted)
        completion_mask[B, T]   bool, True on real completion tokens
        group[B]                long, index of the prompt a row belongs to (verl's `index`/`uid`)
        rewards[B]              float, outcome reward in [0, 1] (after any shaping)
        old_logprobs[B, T]      float, as collected: the sampler's log-prob of each completion token, or 0
                                on rows a strategy builds without them (the resets strategy's reset rows:
                                Collected.sampled_logprobs is False); the trainer's `prepare` replaces them with
                                the policy's exact scores before the update (log pi_old of the ratio) unless
                                they are the sampler's own and the update is on-policy. 0 on padding
        segment_ids[B, T]       long or None, segment index per token, -1 on padding (filled once by
                                the segmentation stage, credo.core.segment.with_segments)
        loss_mask[B, T]         bool or None, tokens that may receive gradient (e.g. False on a reset prefix)
        ref_logprobs[B, T]      float or None, log pi_ref for the KL penalty
    Python-side data:
        problems                the task's problem objects (answer, step truth), one per row
        completions             decoded completion text, one per row
        correct[B]              bool, verifier verdict before reward shaping
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    group: torch.Tensor
    rewards: torch.Tensor
    old_logprobs: torch.Tensor
    correct: torch.Tensor
    problems: list[Any] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    segment_ids: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        B, T = self.completion_ids.shape
        checks = {
            "prompt_mask": tuple(self.prompt_mask.shape) == tuple(self.prompt_ids.shape),
            "completion_mask": tuple(self.completion_mask.shape) == (B, T),
            "old_logprobs": tuple(self.old_logprobs.shape) == (B, T),
            "group": tuple(self.group.shape) == (B,),
            "rewards": tuple(self.rewards.shape) == (B,),
            "correct": tuple(self.correct.shape) == (B,),
        }
        if self.prompt_ids.shape[0] != B:
            raise ValueError(f"Rollouts.prompt_ids has {self.prompt_ids.shape[0]} rows, completion_ids has {B}")
        for name, ok in checks.items():
            if ok is False:
                raise ValueError(f"Rollouts.{name} has shape {tuple(getattr(self, name).shape)}; expected "
                                 f"batch {B}, length {T}")
        for name in ("segment_ids", "loss_mask", "ref_logprobs"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (B, T):
                raise ValueError(f"Rollouts.{name} has shape {tuple(value.shape)}, expected {(B, T)}")

    @property
    def batch_size(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """[B] number of real completion tokens per row."""
        return self.completion_mask.sum(dim=1)

    def trainable_mask(self) -> torch.Tensor:
        """[B, T] bool: completion tokens that may receive gradient."""
        mask = self.completion_mask
        return mask & self.loss_mask if self.loss_mask is not None else mask

    def select(self, index: torch.Tensor | list[int]) -> "Rollouts":
        """Rows `index` (a list or 1-D long tensor), keeping every field aligned."""
        idx = torch.as_tensor(index, dtype=torch.long, device=self.completion_ids.device)
        idx_list = idx.tolist()
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = value[idx]
            elif isinstance(value, list):
                out[f.name] = [value[i] for i in idx_list] if value else []
            else:
                out[f.name] = value
        return Rollouts(**out)

    def with_fields(self, **changes: Any) -> "Rollouts":
        return replace(self, **changes)

    def to(self, device: torch.device | str) -> "Rollouts":
        """Every tensor field on `device` (itself when they are there already: no copy on one device)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})


def concat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """Stack several Rollouts (different P and T allowed) into one, re-padding as needed."""
    if len(parts) == 1:
        return parts[0]
    P = max(p.prompt_ids.shape[1] for p in parts)
    T = max(p.completion_ids.shape[1] for p in parts)

    def left(t: torch.Tensor, width: int, value: Any) -> torch.Tensor:
        return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

    def right(t: torch.Tensor | None, width: int, value: Any) -> torch.Tensor | None:
        return None if t is None else torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    def optional(name: str, value: Any) -> torch.Tensor | None:
        present = [getattr(p, name) is not None for p in parts]
        if not any(present):
            return None
        filled = []
        for p in parts:
            v = getattr(p, name)
            if v is None:  # absent means "default" for this part: all-True mask, -1 segments, zero logprobs
                v = {"loss_mask": p.completion_mask.clone(), "segment_ids": torch.full_like(p.completion_ids, -1),
                     "ref_logprobs": torch.zeros_like(p.old_logprobs)}[name]
            filled.append(right(v, T, value))
        return torch.cat(filled)

    return Rollouts(
        prompt_ids=torch.cat([left(p.prompt_ids, P, pad_id) for p in parts]),
        prompt_mask=torch.cat([left(p.prompt_mask, P, False) for p in parts]),
        completion_ids=torch.cat([right(p.completion_ids, T, pad_id) for p in parts]),
        completion_mask=torch.cat([right(p.completion_mask, T, False) for p in parts]),
        group=torch.cat([p.group for p in parts]),
        rewards=torch.cat([p.rewards for p in parts]),
        old_logprobs=torch.cat([right(p.old_logprobs, T, 0.0) for p in parts]),
        correct=torch.cat([p.correct for p in parts]),
        problems=[x for p in parts for x in p.problems],
        completions=[x for p in parts for x in p.completions],
        segment_ids=optional("segment_ids", -1),
        loss_mask=optional("loss_mask", False),
        ref_logprobs=optional("ref_logprobs", 0.0),
    )


@dataclass
class Credit:
    """What an estimator returns: per-token credit for a batch of Rollouts.

    advantages[B, T]    float, zero outside the completion mask
    weights[B, T]       float or None, multiplicative per-token loss weights (None means 1)
    loss_mask[B, T]     bool or None, restricts which tokens get gradient (None means completion mask)
    segment_credit      list of 1-D float tensors or None, one per row: the estimator's own credit of
                        each of its segments, before broadcasting to tokens and any whitening (for
                        inspection; estimators without segments leave it None). `credo audit` does not
                        read it: it scores every estimator alike, by the mean of advantage x weight
                        over each segment
    cost                tokens the estimator scored/generated beyond sampling the rollouts
    info                scalar diagnostics for logging
    """

    advantages: torch.Tensor
    weights: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    segment_credit: list[torch.Tensor] | None = None
    cost: Cost = field(default_factory=Cost)
    info: dict[str, float] = field(default_factory=dict)
