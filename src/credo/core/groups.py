"""Group operations shared by every estimator and strategy: pure tensor functions of rewards and group ids.

A batch's rows are grouped by `group[B]` (verl's `index`/`uid`): the completions of one prompt. Group
statistics are broadcast back to rows; a group of one has std 0 and no leave-one-out baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from credo.core.config import check



@dataclass(frozen=True)
class GroupNormConfig:
    """GRPO's group normalisation, the options of every estimator that scales a GRPO advantage."""

    std: str = "sample"
    """The group std: 'sample' (Bessel-corrected, as TRL/verl) or 'population' (as the SRPO code)."""
    eps: float = 1e-6
    """Added to the group std."""

    def __post_init__(self) -> None:
        check(self.std in ("sample", "population"), f"credit.std must be 'sample' or 'population', got {self.std!r}")
        check(self.eps >= 0, f"credit.eps must be >= 0, got {self.eps}")

def group_rows(group: torch.Tensor) -> dict[int, list[int]]:
    """group[B] -> {group id: its rows, in batch order}, groups in order of first appearance."""
    out: dict[int, list[int]] = {}
    for row, g in enumerate(group.tolist()):
        out.setdefault(g, []).append(row)
    return out


FLOAT32_EXACT_BELOW = 1e17
"""|values| up to which group_mean_std computes in float32: the squared deviations of a group of up to
MAX_GROUP rows stay far below float32's largest number (3.4e38). Above it (rewards of 1e20 squared are 1e40,
an inf that made every std inf and every GRPO advantage 0) they are computed in float64."""


def group_mean_std(values: torch.Tensor, group: torch.Tensor,
                   unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """values[B], group[B] -> (mean[B], std[B]) of each row's group, broadcast back to rows.

    unbiased=True is the Bessel-corrected sample std (TRL, verl); a group of one has std 0. Values above
    FLOAT32_EXACT_BELOW in magnitude are reduced in float64 (the results in the values' dtype).
    """
    if values.dtype == torch.float32 and values.numel() and float(values.abs().max()) > FLOAT32_EXACT_BELOW:
        mean, std = group_mean_std(values.double(), group, unbiased)
        return mean.to(values.dtype), std.to(values.dtype)
    _, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    counts_f = counts.to(values.dtype)
    sums = torch.zeros(len(counts), dtype=values.dtype, device=values.device).index_add_(0, inverse, values)
    mean = sums / counts_f
    sq = torch.zeros_like(mean).index_add_(0, inverse, (values - mean[inverse]) ** 2)
    denom = (counts_f - 1).clamp(min=1) if unbiased else counts_f
    std = torch.where(counts > 1, (sq / denom).sqrt(), torch.zeros_like(mean))
    return mean[inverse], std[inverse]


def grpo_advantages(rewards: torch.Tensor, group: torch.Tensor, *, std: str = "sample", eps: float = 1e-6,
                    scale: bool = True) -> torch.Tensor:
    """rewards[B], group[B] -> A[B] = (r - mean_g) / (std_g + eps); groups with equal rewards get 0.
    scale=False: r - mean_g (Dr. GRPO). std: 'sample' (Bessel) or 'population'."""
    mean, sd = group_mean_std(rewards, group, unbiased=(std == "sample"))
    centred = rewards - mean
    if not scale:
        return centred
    return torch.where(sd > 1e-8, centred / (sd + eps), torch.zeros_like(centred))


def rloo_advantages(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """rewards[B], group[B] -> A[B], A_i = r_i - mean_{j != i} r_j within the group (0 for a group of one)."""
    _, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, rewards)
    n = counts[inverse].to(rewards.dtype)
    others = (sums[inverse] - rewards) / (n - 1).clamp(min=1)
    return torch.where(n > 1, rewards - others, torch.zeros_like(rewards))


def mixed_group_mask(group: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """group[B], rewards[B] -> [n_groups] bool over the sorted unique group ids: True where rewards differ
    inside the group (the groups that carry an outcome signal)."""
    ids, inverse = torch.unique(group, return_inverse=True)
    hi = torch.full((len(ids),), -float("inf"), device=rewards.device).scatter_reduce(0, inverse, rewards, "amax")
    lo = torch.full((len(ids),), float("inf"), device=rewards.device).scatter_reduce(0, inverse, rewards, "amin")
    return hi > lo


def mean_one(w: torch.Tensor, mask: torch.Tensor, *, floor: float = 1e-8, flat_at: float | None = 0.0) -> torch.Tensor:
    """Token weights w[..., T] rescaled so that each row's mean over `mask` (bool or 0/1) is 1, and 0 off the
    mask: w * mask / mean, the mean clamped to at least `floor`. A row whose mean is not above `flat_at`
    becomes the mask itself (1 on every token: none stands out); flat_at=None keeps every row's quotient
    (a row of zeros stays zeros)."""
    m = mask.to(w.dtype)
    masked = w * m
    mean = masked.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    scaled = masked / mean.clamp(min=floor)
    return scaled if flat_at is None else torch.where(mean > flat_at, scaled, m)


def zscore(values: torch.Tensor, over: torch.Tensor | None = None, min_std: float = 1e-8) -> torch.Tensor:
    """values[N] standardised by the mean and sample std of `over[M]` (default: `values` itself). Guarded:
    zeros when that std is <= min_std or undefined (fewer than two values), so a constant signal gives no
    credit instead of a noise-sized one."""
    over = values if over is None else over
    if over.numel() < 2:
        return torch.zeros_like(values)
    sd = over.std()
    if float(sd) <= min_std:
        return torch.zeros_like(values)
    return (values - over.mean()) / sd


def broadcast(sequence_advantages: torch.Tensor, rollouts: Any) -> torch.Tensor:
    """A[B] -> advantages[B, T] on every trainable token of `rollouts`, zero on padding and masked tokens."""
    return sequence_advantages[:, None] * rollouts.trainable_mask().to(sequence_advantages.dtype)
