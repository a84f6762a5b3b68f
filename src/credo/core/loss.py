"""Policy-gradient losses: PPO clipped surrogate (token or sequence ratio), aggregation modes, k3 KL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from credo.core.config import check

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class LossConfig:
    """The policy-gradient loss of a training step."""

    eps_low: float = 0.2
    """Lower clip range of the ratio: clip(rho, 1 - eps_low, 1 + eps_high)."""
    eps_high: float = 0.2
    """Upper clip range of the ratio (DAPO's clip-higher: 0.28)."""
    ratio: str = "token"
    """'token' (PPO/GRPO) or 'sequence' (GSPO: (pi/pi_old)^(1/|o|) per sequence)."""
    aggregation: str = "seq-mean-token-mean"
    """'seq-mean-token-mean' (GRPO), 'token-mean' (DAPO) or 'seq-mean-token-sum-norm' (Dr. GRPO: sum over
    tokens / (B * max_new_tokens))."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the start policy (0: no reference model is kept)."""
    kind: str = "clip"
    """'clip' (PPO clipped surrogate) or 'pg' (SRPO's public code: -A * log pi, no ratio, no clip)."""

    def __post_init__(self) -> None:
        check(self.kind in ("clip", "pg"), f"train.loss.kind must be 'clip' or 'pg', got {self.kind!r}")
        check(0 <= self.eps_low < 1, f"train.loss.eps_low must be in [0, 1), got {self.eps_low}")
        check(self.eps_high >= 0, f"train.loss.eps_high must be >= 0, got {self.eps_high}")
        check(self.ratio in ("token", "sequence"),
              f"train.loss.ratio must be 'token' or 'sequence', got {self.ratio!r}")
        check(self.aggregation in AGGREGATIONS,
              f"train.loss.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        check(self.kl_coef >= 0, f"train.loss.kl_coef must be >= 0, got {self.kl_coef}")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int) -> torch.Tensor:
    """per_token[B, T], mask[B, T] -> scalar, by aggregation `mode`."""
    m = mask.to(per_token.dtype)
    if mode == "token-mean":
        return (per_token * m).sum() / m.sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_seq = (per_token * m).sum(1) / m.sum(1).clamp(min=1)
        return per_seq.mean()
    if mode == "seq-mean-token-sum-norm":
        return (per_token * m).sum() / (per_token.shape[0] * norm_length)
    raise ValueError(f"unknown aggregation {mode!r}")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(ref - lp) - (ref - lp) - 1 (>= 0)."""
    delta = (ref_logprobs - logprobs).clamp(-20, 20)
    return delta.exp() - delta - 1


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                config: LossConfig, norm_length: int, weights: torch.Tensor | None = None,
                ref_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clipped surrogate `-min(rho*A, clip(rho)*A) * w` (kind 'pg': `-A * log pi * w`) (+ kl_coef * k3), aggregated.

    All inputs [B, T]; `mask` selects the tokens that get gradient. Returns (loss, stats): stats are
    clip_frac (the share of masked tokens whose ratio lies outside the clip range, for either kind), kl, and
    clipped[B, T] (bool: those tokens, for the run's credit log).
    """
    m = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs) * m
    if config.ratio == "sequence":
        seq_log_ratio = log_ratio.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)
        # GSPO-token form: every token carries the sequence ratio's value and its own gradient path,
        # so seq-mean-token-mean aggregation gives exactly GSPO's sequence-level gradient
        log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()
    ratio = torch.exp(log_ratio.clamp(-20, 20))
    clipped = ratio.clamp(1 - config.eps_low, 1 + config.eps_high)
    if config.kind == "pg":
        per_token = -advantages * logprobs
    else:
        per_token = -torch.min(ratio * advantages, clipped * advantages)
    if weights is not None:
        per_token = per_token * weights
    kl_value = torch.zeros((), dtype=logprobs.dtype)
    if config.kl_coef > 0 and ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + config.kl_coef * kl
        kl_value = (kl * m).sum() / m.sum().clamp(min=1)
    loss = aggregate(per_token, mask, config.aggregation, norm_length)
    with torch.no_grad():
        was_clipped = ((ratio - clipped).abs() > 1e-9).to(m.dtype)
        stats = {
            "clip_frac": float((was_clipped * m).sum() / m.sum().clamp(min=1)),
            "kl": float(kl_value),
            "clipped": (was_clipped * m) > 0,
        }
    return loss, stats
