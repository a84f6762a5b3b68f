"""Entropy-based token credit: the high-entropy token mask and GTPO-style entropy-weighted token rewards.

Specification: docs/methods.md, "## Entropy-based token credit". Both read H_{i,t}, the policy's entropy at each
completion position (one scoring pass through the Probe, counted as the estimator's cost):
  entropy_mask  w = 1 on the tokens whose entropy is >= the (1 - q) quantile of the batch's trainable
                tokens' entropies (torch.quantile's linear interpolation, over every data-parallel shard),
                0 elsewhere: TRL's `top_entropy_quantile=q` (GRPOTrainer.get_high_entropy_mask, TRL 1.16),
                which multiplies the per-token loss by the mask and keeps the loss's normaliser;
  gtpo          rows in O+ (form=paper: reward > threshold; form=weights: above the group's mean) and O- (the
                others), with entropy shares
                S+_{i,t} = d_t * H_{i,t} / sum_{k in O+, live at t} H_{k,t} and
                S-_{i,t} = h_t * H_{i,t}^-1 / sum_{k in O-, live at t} H_{k,t}^-1 (d_t, h_t = how many O+ / O- rows
                are live at position t). form=paper (the default): the paper's shaped token rewards a1 r_i + a2 S+
                and -(a1 + a2 S-), each set standardised apart within the group (all-wrong groups get credit);
                form=weights (ours): token weights a1 + a2 S on GRPO's advantage (Credit.weights, as entropy_mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from credo.core.config import check
from credo.core.groups import GroupNormConfig, group_rows, grpo_advantages
from credo.credit.compose import Wrapping, check_wrapped, wrapped_credit, wrapped_privileged
from credo.credit.registry import register
from credo.core.probe import Probe
from credo.core.rollouts import Credit, Rollouts

TORCH_QUANTILE_LIMIT = 16_000_000  # torch.quantile refuses larger inputs; numpy's linear rule is the same


def token_entropies(rollouts: Rollouts, probe: Probe) -> torch.Tensor:
    """H[B, T]: the policy's entropy (nats) at each completion position, 0 on padding (one scoring pass)."""
    _, entropies = probe.score(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids,
                               rollouts.completion_mask, entropy=True)
    return entropies.float() * rollouts.completion_mask.float()


def quantile_threshold(values: torch.Tensor, level: float) -> float:
    """The `level` quantile of 1-D `values` by linear interpolation (torch.quantile's default, as TRL)."""
    if values.numel() <= TORCH_QUANTILE_LIMIT:
        return float(torch.quantile(values.detach().float(), level))
    return float(np.quantile(values.detach().float().cpu().numpy(), level))


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, q: float,
                      gather: Any = None) -> torch.Tensor:
    """entropies[B, T], mask[B, T] -> bool[B, T]: the valid tokens whose entropy is >= the (1 - q) quantile of
    the valid tokens' entropies (`gather`: of every shard's). All False when no token is valid."""
    valid = mask.bool()
    pooled = entropies[valid].float()
    pooled = gather(pooled) if gather is not None else pooled
    if pooled.numel() == 0:
        return torch.zeros_like(valid)
    threshold = quantile_threshold(pooled, 1.0 - q)
    return (entropies * valid.float() >= threshold) & valid


@dataclass(frozen=True)
class EntropyMaskConfig(GroupNormConfig, Wrapping):
    """The high-entropy token mask (docs/methods.md, "## Entropy-based token credit")."""


    q: float = 0.2
    """Share of the batch's trainable tokens kept, by entropy (TRL's top_entropy_quantile; 0.2 as the 80/20 paper)."""
    of: str = field(default="", metadata={"omit_default": True})
    """The credit the mask applies to: '' = GRPO's, with this config's std and eps (TRL's mask); or any
    registered estimator (credo.credit.compose), whose advantages stay and whose token weights (1 where it has
    none) are multiplied by the mask: `entropy_mask:of=rredcot` puts RREDCoT's credit on forking tokens only."""
    options: dict = field(default_factory=dict, metadata={"omit_default": True})
    """The wrapped method's options; any key not named here lands in it."""

    def __post_init__(self) -> None:
        super().__post_init__()  # std, eps
        check(0 <= self.q <= 1, f"credit.q must be in [0, 1], got {self.q}")
        check_wrapped("entropy_mask", self.of, self.options)
        # with of=, the wrapped method's advantages are kept as they are: std and eps would do nothing
        check(not self.of or (self.std, self.eps) == (GroupNormConfig.std, GroupNormConfig.eps),
              f"credit.std/eps do nothing with of={self.of} (its advantages are kept): write options.std=... or "
              "options.eps=... for the wrapped method's")


@register("entropy_mask", "high-entropy token mask: GRPO on the top q (0.2) of the batch's tokens by the "
          "policy's entropy only, as TRL's top_entropy_quantile (of=<method>: that method's credit, masked)",
          EntropyMaskConfig, uses_model=True, privileged=wrapped_privileged)
def entropy_mask(rollouts: Rollouts, probe: Probe, config: EntropyMaskConfig) -> Credit:
    mask = rollouts.trainable_mask()
    entropies = token_entropies(rollouts, probe)
    keep = high_entropy_mask(entropies, mask, config.q, probe.gather)
    info = {"kept_token_share": float(keep.sum() / mask.sum().clamp(min=1))}
    if config.of:
        base, _ = wrapped_credit(config.of, config.options, rollouts, probe)
        weights = keep.float() if base.weights is None else base.weights * keep.float()
        return Credit(advantages=base.advantages, weights=weights, loss_mask=base.loss_mask, info={**base.info, **info})
    adv = grpo_advantages(rollouts.rewards.float(), rollouts.group, std=config.std, eps=config.eps).to(mask.device)
    return Credit(advantages=adv[:, None] * mask.float(), weights=keep.float(), info=info)


@dataclass(frozen=True)
class GTPOConfig(GroupNormConfig):
    """GTPO-style entropy-weighted token rewards (docs/methods.md, "## Entropy-based token credit")."""

    a1: float = 1.0
    """Weight every token keeps (the paper's alpha_1)."""
    a2: float = 0.1
    """Weight of the entropy share (the paper's alpha_2; 0: plain GRPO)."""
    h_min: float = 1e-6
    """Floor of H before it is inverted for the O- rows (an entropy-0 token would take the whole share)."""
    form: str = "paper"
    """'paper': the paper's shaped token rewards, each of O+ (reward > threshold) and O- standardised apart
    within the group, as textpolicy's paper-exact GTPO (docs/methods.md); 'weights' (ours): the entropy shares
    as token weights on GRPO's advantage (weights of 1 to 1.1: nearly GRPO, and no credit in all-wrong groups)."""
    threshold: float = 0.5
    """form=paper: a row whose reward exceeds it is in O+ (textpolicy's reward_threshold)."""

    def __post_init__(self) -> None:
        super().__post_init__()  # std, eps
        check(self.form in ("weights", "paper"), f"credit.form must be 'weights' or 'paper', got {self.form!r}")
        check(0 <= self.a1 <= 10, f"credit.a1 must be in [0, 10], got {self.a1}")
        check(0 <= self.a2 <= 10, f"credit.a2 must be in [0, 10], got {self.a2}")
        check(self.a1 + self.a2 > 0, f"credit.a1 + credit.a2 must be > 0, got {self.a1} + {self.a2}")
        check(0 < self.h_min <= 1, f"credit.h_min must be in (0, 1], got {self.h_min}")


def entropy_shares(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """scores[n, T] >= 0 of n rows, mask[n, T] -> count_t * scores / sum over the live rows at t (the
    share of position t's total, times the rows live there: 1 on average); 1 where the total is 0."""
    m = mask.float()
    total = (scores * m).sum(0, keepdim=True)
    live = m.sum(0, keepdim=True)
    share = torch.where(total > 0, scores * live / total.clamp(min=1e-30), torch.ones_like(scores))
    return share * m


def gtpo_weights(entropies: torch.Tensor, mask: torch.Tensor, group: torch.Tensor, advantages: torch.Tensor,
                 config: GTPOConfig) -> torch.Tensor:
    """entropies[B, T], mask[B, T], group[B], advantages[B] (GRPO) -> weights[B, T] (module docstring);
    rows with a zero advantage keep weight 1 (their credit is 0 anyway)."""
    weights = mask.float().clone()
    for rows in group_rows(group).values():
        index = torch.tensor(rows, dtype=torch.long, device=entropies.device)
        a = advantages[index]
        for side, score in ((a > 0, entropies[index]), (a < 0, 1.0 / entropies[index].clamp(min=config.h_min))):
            if not bool(side.any()):
                continue
            members = index[side]
            share = entropy_shares(score[side], mask[members])
            weights[members] = (config.a1 + config.a2 * share) * mask[members].float()
    return weights


PAPER_EPS = 1e-8  # textpolicy's eps (Remark 2.1): added to H before inverting and to each set's variance


def gtpo_paper_advantages(entropies: torch.Tensor, mask: torch.Tensor, group: torch.Tensor, rewards: torch.Tensor,
                          config: GTPOConfig) -> torch.Tensor:
    """The paper's GTPO advantages[B, T] from entropies[B, T], mask[B, T], group[B], rewards[B]: per group,
    O+ tokens get r+ = a1 r_i + a2 d_t H_{i,t} / sum_{O+ live at t} H, O- tokens r- = -(a1 + a2 h_t H^-1 / sum
    H^-1) (a share is 0 where its position's total is); each set's tokens are then standardised apart
    (population std + PAPER_EPS under the root). Within a set the outcome's constant cancels: the entropy term
    carries the credit, and a group with no right (or no wrong) member is credited too."""
    advantages = torch.zeros_like(entropies, dtype=torch.float64)  # a set's spread can be ~1e-5 of its values
    live = mask.double()
    entropies = entropies.double()
    for rows in group_rows(group).values():
        index = torch.tensor(rows, dtype=torch.long, device=entropies.device)
        positive = rewards[index] > config.threshold
        for side, sign in ((positive, 1.0), (~positive, -1.0)):
            if not bool(side.any()):
                continue
            members, m = index[side], live[index[side]]
            h = entropies[members] * m
            score = h if sign > 0 else m / (h + PAPER_EPS)
            total = score.sum(0)
            share = torch.where(total > 0, score / total.clamp(min=1e-30), torch.zeros_like(score)) * m.sum(0)
            if sign > 0:
                shaped = config.a1 * rewards[members].double()[:, None] + config.a2 * share
            else:
                shaped = -(config.a1 + config.a2 * share)
            values = shaped[m.bool()]
            mean = values.mean()
            std = torch.sqrt(((values - mean) ** 2).mean() + PAPER_EPS)
            advantages[members] = (shaped - mean) / std * m
    return advantages.float()


@register("gtpo", "GTPO-style: GRPO with entropy-weighted token rewards (above-mean rows: high entropy weighs more; "
          "below-mean rows: confident tokens weigh more)", GTPOConfig, uses_model=True)
def gtpo(rollouts: Rollouts, probe: Probe, config: GTPOConfig) -> Credit:
    mask = rollouts.trainable_mask()
    entropies = token_entropies(rollouts, probe)
    info = {"entropy_mean": float((entropies * mask).sum() / mask.sum().clamp(min=1))}
    if config.form == "paper":
        return Credit(advantages=gtpo_paper_advantages(entropies, mask, rollouts.group,
                                                       rollouts.rewards.to(mask.device), config), info=info)
    adv = grpo_advantages(rollouts.rewards.float(), rollouts.group, std=config.std, eps=config.eps).to(mask.device)
    weights = gtpo_weights(entropies, mask, rollouts.group, adv, config)
    return Credit(advantages=adv[:, None] * mask.float(), weights=weights, info=info)
