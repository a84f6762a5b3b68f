"""Estimators on Monte Carlo state values (VinePPO / SPO-chain); the MC value probe itself is
credo.core.values.mc_values (shared with the audit). Specification: docs/methods.md, "## VinePPO and SPO-chain".

`V_mc(s_k)` is the mean reward of K continuations sampled from "prompt + completion up to the end
of segment k"; `s_0` is the prompt alone and `V(s_K) := r`, the observed outcome. The step
advantage of segment k is `V(s_k) - V(s_{k-1})`, so a trace's segment advantages telescope to
`r - V(s_0)`. Continuations of all prefixes of a batch are sampled together in large batches.
A prefix that already states a final answer is terminal: its value is its own reward, unsampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from credo.core.config import MAX_SAMPLES, MAX_STEP_COMPLETIONS, check, check_in
from credo.credit.registry import register
from credo.core.values import mc_values
from credo.core.probe import Probe
from credo.core.rollouts import Credit, Rollouts
from credo.core.segment import broadcast_segments, check_segmenter_option, segments_for, segmenter_config


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """values[B, T] standardised over the tokens where mask[B, T] is True (mean 0, unbiased variance 1,
    as VinePPO's `masked_whiten(..., unbiased_variance=True)`); 0 outside the mask. Fewer than two
    tokens: returned unchanged (the unbiased variance is undefined)."""
    n = int(mask.sum())
    if n < 2:
        return values * mask
    active = values[mask]
    mean = active.mean()
    var = ((active - mean) ** 2).sum() / (n - 1)
    return (values - mean) * torch.rsqrt(var + eps) * mask


@dataclass(frozen=True)
class VinePPOConfig:
    """VinePPO's Monte Carlo step values (module docstring)."""

    k: int = 9
    """Continuations sampled per segment boundary to estimate V(s_k) (VinePPO uses 9)."""
    segmenter: Any = ""
    """The steps: '' = the batch's segments (the task's own segmenter), or a segmenter name or mapping of its
    own (credo.core.segment)."""
    batch_size: int = 1024
    """Continuations sampled per generation batch (bounds memory, not results)."""
    whiten: bool = True
    """Standardise the token advantages over the batch's trainable tokens, as VinePPO's trainer does before
    its loss (`whiten_advantages: true`); without it the MC step differences are ~4x smaller than GRPO's
    advantages. The audit turns it off (a positive affine map leaves its rank figures unchanged, and
    segment_credit stays the raw V(s_k) - V(s_{k-1}) either way)."""

    def __post_init__(self) -> None:
        check(self.k > 0, f"credit.k must be > 0, got {self.k}")
        check_in(self.k, 1, MAX_SAMPLES, "credit.k")
        check(self.batch_size > 0, f"credit.batch_size must be > 0, got {self.batch_size}")
        check_in(self.batch_size, 1, MAX_STEP_COMPLETIONS, "credit.batch_size")
        check_segmenter_option(self.segmenter)


@register("vineppo", "VinePPO-style MC: k continuations per segment boundary, A_k = V(s_k) - V(s_{k-1})",
          VinePPOConfig, uses_model=True, needs_segments=True)
def vineppo(rollouts: Rollouts, probe: Probe, config: VinePPOConfig) -> Credit:
    """Cost: k * (number of non-terminal boundaries) continuations per trace, each generated in full.
    VinePPO's code whitens per (distributed) mini-batch inside its loss; credo whitens once over the
    whole batch the credit is computed for."""
    segment_ids = segments_for(rollouts, probe, config.segmenter)
    mc = mc_values(probe, rollouts, segment_ids, config.k, config.batch_size)
    diffs = mc.differences()
    mask = rollouts.trainable_mask()
    advantages = broadcast_segments(diffs, segment_ids) * mask
    if config.whiten:
        advantages = masked_whiten(advantages, mask)
    return Credit(advantages=advantages, segment_credit=diffs,
                  info={"segments_per_trace": float(sum(len(d) for d in diffs) / max(len(diffs), 1))})


@dataclass(frozen=True)
class SPOChainConfig:
    """SPO-chain's Monte Carlo values at low-probability cutpoints (module docstring)."""

    k: int = 4
    """Continuations sampled per cutpoint segment boundary to estimate its value."""
    p: float = 0.9
    """A token is a cutpoint (and the only kind of token that gets gradient) when its old probability is
    below p, in (0, 1]."""
    every: int = 1
    """Keep every m-th cutpoint as a segment boundary (1: all of them; larger: fewer, cheaper segments)."""
    batch_size: int = 1024
    """Continuations sampled per generation batch (bounds memory, not results)."""

    def __post_init__(self) -> None:
        check(self.k > 0, f"credit.k must be > 0, got {self.k}")
        check_in(self.k, 1, MAX_SAMPLES, "credit.k")
        check(0 < self.p <= 1, f"credit.p must be in (0, 1], got {self.p}")
        check(self.every > 0, f"credit.every must be > 0, got {self.every}")


@register("spo_chain", "SPO-chain: MC values at low-probability cutpoints; gradient only on tokens with p_old < 0.9",
          SPOChainConfig, uses_model=True)
def spo_chain(rollouts: Rollouts, probe: Probe, config: SPOChainConfig) -> Credit:
    """Cost: k continuations per cutpoint segment boundary. The probability mask keeps the gradient
    on the tokens where the policy actually made a choice."""
    seg_cfg = segmenter_config({"name": "cutpoints", "p": config.p, "every": config.every})
    segment_ids = probe.segment(rollouts, seg_cfg)
    mc = mc_values(probe, rollouts, segment_ids, config.k, config.batch_size)
    diffs = mc.differences()
    advantages = broadcast_segments(diffs, segment_ids) * rollouts.trainable_mask()
    probability_mask = (rollouts.old_logprobs.exp() < config.p) & rollouts.completion_mask
    return Credit(advantages=advantages, loss_mask=probability_mask, segment_credit=diffs,
                  info={"masked_token_share":
                        float(probability_mask.sum() / rollouts.completion_mask.sum().clamp(min=1))})
