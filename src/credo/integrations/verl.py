"""credo's reward-only estimators in verl's advantage-estimator registry, under `credo_*` names.

    from credo.integrations.verl import register_with_verl
    register_with_verl()            # then: algorithm.adv_estimator=credo_grpo (or credo_rloo, credo_dr_grpo)

Each registered function has verl's signature
    fn(token_level_rewards[B, T], response_mask[B, T], index: np.ndarray, epsilon=1e-6,
       norm_adv_by_std_in_grpo=True, config=None, **kwargs) -> (advantages[B, T], returns[B, T])
and, like verl's own GRPO, treats a group of one as mean 0, std 1 (its advantage is its score).

Estimators that need the model (rredcot, vineppo, sc_grpo, ...) cannot run inside that signature:
verl passes only rewards, mask and group ids. Their path is a trainer hook: subclass
`verl.trainer.ppo.ray_trainer.RayPPOTrainer`, and after `compute_log_prob` build credo `Rollouts`
from the `DataProto` batch (`prompts`, `responses`, `response_mask`, `uid`, `token_level_scores`),
run `credo.credit.get(name)(rollouts, Probe(policy, task, ...))` with a policy wrapping the actor's
Hugging Face module (`credo.policy.hf.HFPolicy(module, tokenizer, cast=False)`), and write
`credit.advantages` into `batch["advantages"]` (and `batch["returns"]`) before the actor update.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from credo.credit.outcome import grpo_advantages, rloo_advantages

REWARD_ONLY = ("grpo", "dr_grpo", "rloo")


def _group_ids(index: Any) -> torch.Tensor:
    """verl's `index` (uids: strings or ints, np.ndarray or list) -> dense long group ids."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def _singletons(group: torch.Tensor) -> torch.Tensor:
    _, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    return counts[inverse] == 1


def make_verl_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A verl-signature wrapper of credo's reward-only estimator `name`."""
    if name not in REWARD_ONLY:
        raise ValueError(f"only reward-only estimators fit verl's signature: {REWARD_ONLY}; "
                         f"{name!r} needs the model (see this module's docstring for the trainer-hook path)")

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, epsilon: float = 1e-6,
                  norm_adv_by_std_in_grpo: bool = True, config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        scores = token_level_rewards.sum(-1).float()
        group = _group_ids(index).to(scores.device)
        if name == "rloo":
            adv = rloo_advantages(scores, group)
        else:
            scale = norm_adv_by_std_in_grpo and name == "grpo"
            adv = grpo_advantages(scores, group, eps=epsilon, scale=scale)
        adv = torch.where(_singletons(group), scores / (1.0 + epsilon) if name == "grpo" and norm_adv_by_std_in_grpo
                          else scores, adv)
        advantages = adv[:, None] * response_mask.to(adv.dtype)
        return advantages.to(token_level_rewards.dtype), advantages.to(token_level_rewards.dtype)

    estimator.__name__ = f"credo_{name}"
    estimator.__doc__ = f"credo's {name} advantages with verl's estimator signature."
    return estimator


def register_with_verl() -> list[str]:
    """Register credo_grpo, credo_dr_grpo, credo_rloo in verl's registry; returns the names."""
    try:
        from verl.trainer.ppo.core_algos import register_adv_est
    except ImportError as err:
        raise ImportError("register_with_verl needs verl importable (pip install verl)") from err
    names = []
    for name in REWARD_ONLY:
        register_adv_est(f"credo_{name}")(make_verl_estimator(name))
        names.append(f"credo_{name}")
    return names
