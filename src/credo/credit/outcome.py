"""Outcome-only baselines: GRPO, Dr. GRPO, RLOO, over the group operations of credo.core.groups.

Each sequence-level advantage is broadcast to every trainable token of its completion, so
padding (and any masked prefix) gets exactly zero credit.
"""

from __future__ import annotations

from dataclasses import dataclass

from credo.core.groups import GroupNormConfig, broadcast, grpo_advantages, rloo_advantages
from credo.credit.registry import NoConfig, register
from credo.core.rollouts import Credit, Rollouts


@dataclass(frozen=True)
class GRPOConfig(GroupNormConfig):
    """GRPO's group normalisation (std, eps: credo.core.groups.GroupNormConfig)."""


@register("grpo", "GRPO: group-normalised outcome reward (r - mean) / std on every token", GRPOConfig)
def grpo(rollouts: Rollouts, probe: object, config: GRPOConfig) -> Credit:
    adv = grpo_advantages(rollouts.rewards, rollouts.group, std=config.std, eps=config.eps)
    return Credit(advantages=broadcast(adv, rollouts))


@register("dr_grpo", "Dr. GRPO's credit: r - group mean, no std (the constant-length loss comes with the dr_grpo "
          "recipe, credo.train.methods)", NoConfig)
def dr_grpo(rollouts: Rollouts, probe: object, config: NoConfig) -> Credit:
    adv = grpo_advantages(rollouts.rewards, rollouts.group, scale=False)
    return Credit(advantages=broadcast(adv, rollouts))


@register("rloo", "RLOO: r_i minus the mean reward of the other members of its group", NoConfig)
def rloo(rollouts: Rollouts, probe: object, config: NoConfig) -> Credit:
    return Credit(advantages=broadcast(rloo_advantages(rollouts.rewards, rollouts.group), rollouts))
