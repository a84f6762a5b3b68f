"""Outcome-only baselines: GRPO, Dr. GRPO, RLOO. Pure tensor functions of rewards and groups.

Each sequence-level advantage is broadcast to every trainable token of its completion, so
padding (and any masked prefix) gets exactly zero credit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from credo.config import check
from credo.credit.registry import NoConfig, register
from credo.rollouts import Credit, Rollouts


def group_mean_std(values: torch.Tensor, group: torch.Tensor, unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """values[B], group[B] -> (mean[B], std[B]) of each row's group, broadcast back to rows.

    unbiased=True is the Bessel-corrected sample std (TRL, verl); a group of one has std 0.
    """
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
    """rewards[B], group[B] -> A[B] = (r - mean_g) / (std_g + eps); groups with equal rewards get 0."""
    mean, sd = group_mean_std(rewards, group, unbiased=(std == "sample"))
    centred = rewards - mean
    if not scale:
        return centred
    return torch.where(sd > 1e-8, centred / (sd + eps), torch.zeros_like(centred))


def rloo_advantages(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """A_i = r_i - mean_{j != i} r_j within the group (0 for a group of one)."""
    _, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, rewards)
    n = counts[inverse].to(rewards.dtype)
    others = (sums[inverse] - rewards) / (n - 1).clamp(min=1)
    return torch.where(n > 1, rewards - others, torch.zeros_like(rewards))


def broadcast(sequence_advantages: torch.Tensor, rollouts: Rollouts) -> torch.Tensor:
    """A[B] -> advantages[B, T], zero on padding and masked tokens."""
    return sequence_advantages[:, None] * rollouts.trainable_mask().to(sequence_advantages.dtype)


@dataclass(frozen=True)
class GRPOConfig:
    """std: 'sample' (Bessel-corrected, as TRL/verl) or 'population' (as the SRPO code); eps added to std."""

    std: str = "sample"
    eps: float = 1e-6

    def __post_init__(self) -> None:
        check(self.std in ("sample", "population"), f"credit.std must be 'sample' or 'population', got {self.std!r}")
        check(self.eps >= 0, f"credit.eps must be >= 0, got {self.eps}")


@register("grpo", "GRPO: group-normalised outcome reward (r - mean) / std on every token", GRPOConfig)
def grpo(rollouts: Rollouts, probe: object, config: GRPOConfig) -> Credit:
    adv = grpo_advantages(rollouts.rewards, rollouts.group, std=config.std, eps=config.eps)
    return Credit(advantages=broadcast(adv, rollouts))


@register("dr_grpo", "Dr. GRPO: r - group mean, no std; loss normalised by a constant length", NoConfig)
def dr_grpo(rollouts: Rollouts, probe: object, config: NoConfig) -> Credit:
    adv = grpo_advantages(rollouts.rewards, rollouts.group, scale=False)
    return Credit(advantages=broadcast(adv, rollouts))


@register("rloo", "RLOO: r_i minus the mean reward of the other members of its group", NoConfig)
def rloo(rollouts: Rollouts, probe: object, config: NoConfig) -> Credit:
    return Credit(advantages=broadcast(rloo_advantages(rollouts.rewards, rollouts.group), rollouts))
