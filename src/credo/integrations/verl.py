"""credo in verl: every estimator through the worker-side credit step, and the reward-only ones in
verl's own advantage-estimator registry.

Any estimator (rredcot, vineppo, sc_grpo, ibpo, loo, ...), with the model:
    from credo.integrations.verl import apply_credit
    batch = apply_credit(batch, "rredcot", module=hf_model, tokenizer=tok, task=make_task("gym:chain_sum"))
runs on one data-parallel shard of a verl `DataProto` (verl_credit.py); in verl's PPO loop it is
`algorithm.adv_estimator=credo:<name>` with `python -m credo.integrations.verl_ppo` (a worker mixin
registered with verl's dispatch plus a RayPPOTrainer subclass: verl_worker.py, verl_ppo.py).

Reward-only estimators, inside verl's signature:
    from credo.integrations.verl import register_with_verl
    register_with_verl()            # then: algorithm.adv_estimator=credo_grpo (or credo_rloo, credo_dr_grpo)

Each registered function has verl's signature
    fn(token_level_rewards[B, T], response_mask[B, T], index: np.ndarray, epsilon=1e-6,
       norm_adv_by_std_in_grpo=True, config=None, **kwargs) -> (advantages[B, T], returns[B, T])
and, like verl's own GRPO, treats a group of one as mean 0, std 1 (its advantage is its score).
Estimators that need the model cannot run inside that signature (verl passes only rewards, mask and
group ids): they take the apply_credit path above.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from credo.credit.groups import grpo_advantages, rloo_advantages
from credo.integrations.verl_credit import apply_credit, credit_on_shards, dataset_row  # noqa: F401  (re-exported)

REWARD_ONLY = ("grpo", "dr_grpo", "rloo")


def _group_ids(index: Any) -> torch.Tensor:
    """verl's `index` (uids: strings or ints, np.ndarray or list) -> dense long group ids."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def _singletons(group: torch.Tensor) -> torch.Tensor:
    _, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    return counts[inverse] == 1


def _config_value(config: Any, key: str) -> Any:
    """config[key] of a dict, DictConfig or dataclass config (None when absent)."""
    if config is None:
        return None
    if hasattr(config, "get"):
        return config.get(key)
    return getattr(config, key, None)


def make_verl_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A verl-signature wrapper of credo's reward-only estimator `name`."""
    if name not in REWARD_ONLY:
        raise ValueError(f"only reward-only estimators fit verl's signature: {REWARD_ONLY}; "
                         f"{name!r} needs the model: use apply_credit / algorithm.adv_estimator=credo:{name}")

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, epsilon: float = 1e-6,
                  norm_adv_by_std_in_grpo: bool = True, config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # verl hands its own GRPO the flag, but a registered estimator only `config` (algorithm config)
        from_config = _config_value(config, "norm_adv_by_std_in_grpo")
        norm_adv_by_std_in_grpo = norm_adv_by_std_in_grpo if from_config is None else bool(from_config)
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
