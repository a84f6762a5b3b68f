"""credo in verl: every estimator through the worker-side credit step, and the reward-only ones in
verl's own advantage-estimator registry.

Any estimator (rredcot, vineppo, sc_grpo, ibpo, loo, ...), with the model:
    from credo.integrations.verl_credit import apply_credit
    batch = apply_credit(batch, "rredcot", module=hf_model, tokenizer=tok, task=make_task("gym:chain_sum"))
runs on one data-parallel shard of a verl `DataProto` (verl_credit.py); in verl's PPO loop it is
`algorithm.adv_estimator=credo:<name>` with `python -m credo.integrations.verl_ppo` (a worker mixin
registered with verl's dispatch plus a RayPPOTrainer subclass: verl_worker.py, verl_ppo.py).

Reward-only estimators, inside verl's signature: with credo installed, `import verl` registers them (the
`verl.plugins` entry point, verl_plugin.py), so `algorithm.adv_estimator=credo_grpo` (or credo_rloo,
credo_dr_grpo) works with verl's own main; by hand, or to change their settings:
    from credo.integrations.verl import register_with_verl
    register_with_verl(checks=False)

Each registered function has verl's signature
    fn(token_level_rewards[B, T], response_mask[B, T], index: np.ndarray, epsilon=1e-6,
       norm_adv_by_std_in_grpo=True, config=None, **kwargs) -> (advantages[B, T], returns[B, T])
and, like verl's own GRPO, treats a group of one as mean 0, std 1 (its advantage is its score).
Estimators that need the model cannot run inside that signature (verl passes only rewards, mask and
group ids): they take the apply_credit path above.

A malformed input (no rows, no `index`, token_level_rewards of another shape than response_mask, a NaN
reward) is one UserError naming the field and the row. With checks=True (the default;
register_with_verl(checks=False) turns them off) the advantages pass credo's credit sanity checks
(credo.integrations.checks: finite, zero outside response_mask, group sums ~0 over groups of two or more)
before verl gets them. verl passes no step: errors name the call count of the estimator in this process.
A row's score is the sum of its token_level_rewards over all R positions, as verl's own GRPO reads it: verl's
reward manager puts the score on the last real token, which response_mask leaves out when a multi-turn rollout
ends on a tool output (and on the last padding position for an empty response), so no position of it is masked
and the masked-perturbation leak check (leak_check.py) has nothing to refill here; apply_credit runs it.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from credo.core.groups import grpo_advantages, rloo_advantages
from credo.integrations import checks as credit_checks
from credo.integrations.verl_batch import check_estimator_inputs

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


def make_verl_estimator(name: str, checks: bool = True) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A verl-signature wrapper of credo's reward-only estimator `name`; checks: credo's credit sanity checks."""
    if name not in REWARD_ONLY:
        raise ValueError(f"only reward-only estimators fit verl's signature: {REWARD_ONLY}; "
                         f"{name!r} needs the model: use apply_credit / algorithm.adv_estimator=credo:{name}")

    calls = [0]

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                  epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, config: Any = None,
                  **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        calls[0] += 1
        step = f"{calls[0]} (call {calls[0]} of credo_{name} in this process)"
        check_estimator_inputs(token_level_rewards, response_mask, index, step)
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
        if checks:
            _check(advantages, response_mask, group, index, step)
        return advantages.to(token_level_rewards.dtype), advantages.to(token_level_rewards.dtype)

    estimator.credo_estimator = name  # how register_with_verl knows an earlier registration as credo's own
    estimator.__name__ = f"credo_{name}"
    estimator.__doc__ = f"credo's {name} advantages with verl's estimator signature."
    return estimator


def _check(advantages: torch.Tensor, response_mask: torch.Tensor, group: torch.Tensor, index: Any, step: str) -> None:
    """credo's credit checks on a registered estimator's advantages[B, R] (verl hands it no padding mask: the
    response_mask is both the real and the trained tokens)."""
    uids = np.asarray(index).reshape(-1)
    where = credit_checks.Where(step=step, off="register_with_verl(checks=False)",
                                row_name=lambda i: f"row {i} (uid {uids[i]!r})")
    mask = response_mask.bool()
    credit_checks.check_advantages(advantages.detach(), mask, mask, where)
    credit_checks.check_group_sums(advantages.detach(), mask, group, where)


def register_with_verl(checks: bool = True, names: tuple[str, ...] = REWARD_ONLY) -> list[str]:
    """Register credo_<name> for each of `names` (default credo_grpo, credo_dr_grpo, credo_rloo) in verl's
    registry; returns the registered names. checks: credo's credit sanity checks on every call
    (credo.integrations.checks). A credo estimator registered before (by credo's verl plugin on `import verl`,
    verl_plugin.py) is replaced, so these settings win; any other estimator of the name is left to verl's error."""
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as err:
        raise ImportError("register_with_verl needs verl importable (pip install verl)") from err
    registered = []
    for name in names:
        estimator = make_verl_estimator(name, checks=checks)
        key = f"credo_{name}"
        known = getattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {})
        if getattr(known.get(key), "credo_estimator", None) == name:
            del known[key]  # ours: verl refuses a second function under one name
        core_algos.register_adv_est(key)(estimator)
        registered.append(key)
    return registered
