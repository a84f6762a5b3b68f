"""The optimal token baseline (OTB), as verl 0.9.1 ships it (`compute_optimal_token_baseline_advantage`).

Specification: docs/methods.md, "## Optimal token baseline (OTB)". Per group and completion position t:
  w_t = 1 - 2 pi_t + sum_v pi(v)^2       (pi_t: the probability of the sampled token; a per-token proxy of
                                           the squared norm of the log-probability's logit gradient)
  W_{i,t} = sum_{j <= t} w_j over the row's trainable tokens      G_{i,t} = return from t (the outcome r_i)
  B_t = sum_i G_{i,t} W_{i,t} m_{i,t} / (sum_i W_{i,t} m_{i,t} + eps)    A_{i,t} = (G_{i,t} - B_t) m_{i,t}
with verl's `handle_zero_tail` (the longest row's positions past the second longest get baseline 0 when
it is the only longest) and a group of one left without baseline. pi and sum pi^2 come from one scoring
pass of the policy through the Probe (full next-token distributions), as verl's actor computes them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from credo.core.config import check
from credo.credit.registry import register
from credo.core.probe import Probe
from credo.core.rollouts import Credit, Rollouts


@dataclass(frozen=True)
class OTBConfig:
    """The optimal token baseline (docs/methods.md, "## Optimal token baseline (OTB)")."""

    handle_zero_tail: bool = True
    """verl's default: baseline 0 on the sole longest row's positions past the group's second longest."""
    epsilon: float = 1e-8
    """Added to the baseline's denominator (verl's default); > 0: with 0 a position no row of the group reaches
    divides 0 by 0."""
    chunk_rows: int = 64
    """Rows per scoring pass (bounds the memory of the full next-token distributions)."""

    def __post_init__(self) -> None:
        check(0 < self.epsilon <= 1, f"credit.epsilon must be in (0, 1], got {self.epsilon}")
        check(1 <= self.chunk_rows <= 65_536, f"credit.chunk_rows must be in 1..65,536, got {self.chunk_rows}")


def otb_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor, logprobs: torch.Tensor,
                   sum_pi_squared: torch.Tensor, handle_zero_tail: bool = True, epsilon: float = 1e-8) -> torch.Tensor:
    """token_rewards[B, T], mask[B, T], group[B], logprobs[B, T] (of the sampled tokens), sum_pi_squared[B, T]
    -> advantages[B, T] by the optimal token baseline (module docstring)."""
    m = mask.to(token_rewards.dtype)
    returns = (token_rewards * m).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * torch.exp(logprobs) + sum_pi_squared
    cumulative = (w * m).cumsum(-1)
    baselines = torch.zeros_like(returns)
    members: "OrderedDict[int, list[int]]" = OrderedDict()
    for row, g in enumerate(group.tolist()):
        members.setdefault(g, []).append(row)
    for rows in members.values():
        if len(rows) == 1:
            continue  # no baseline: the advantage is the return
        index = torch.tensor(rows, device=returns.device)
        weight = cumulative[index] * m[index]
        baseline = (returns[index] * weight).sum(0) / (weight.sum(0) + epsilon)
        baselines[index] = baseline.unsqueeze(0).expand(len(rows), -1)
        if handle_zero_tail:
            _zero_tail(baselines, index, m[index].sum(-1))
    return (returns - baselines) * m


def _zero_tail(baselines: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor) -> None:
    """In place: the sole longest row of a group gets baseline 0 past the group's second-longest length."""
    ordered = torch.sort(lengths).values
    longest, second = int(ordered[-1]), int(ordered[-2])
    at = (lengths == longest).nonzero().flatten()
    if at.numel() == 1 and longest > second:
        baselines[int(index[int(at[0])]), second:] = 0.0


def sampled_token_statistics(rollouts: Rollouts, probe: Probe, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi[B, T] of the sampled tokens, sum_v pi(v)^2 [B, T]) from the policy's full next-token
    distributions, `chunk_rows` rows per pass; 0 on padding."""
    logprobs = torch.zeros(rollouts.completion_ids.shape, dtype=torch.float32)
    squares = torch.zeros_like(logprobs)
    for start in range(0, rollouts.batch_size, chunk_rows):
        rows = slice(start, start + chunk_rows)
        mask = rollouts.completion_mask[rows]
        logits = probe.completion_logits(rollouts.prompt_ids[rows], rollouts.prompt_mask[rows],
                                         rollouts.completion_ids[rows], mask)
        log_pi = F.log_softmax(logits.float(), dim=-1)
        del logits  # not needed past log_pi: free it before the work below (one [rows, T, V] tensor, not four)
        chosen = log_pi.gather(-1, rollouts.completion_ids[rows].unsqueeze(-1)).squeeze(-1)
        logprobs[rows] = (chosen * mask).cpu()
        squares[rows] = (log_pi.exp_().square_().sum(-1) * mask).cpu()  # in place: pi, then pi^2
    device = rollouts.completion_ids.device
    return logprobs.to(device), squares.to(device)


@register("otb", "OTB: per-position baseline weighted by the cumulative logit-gradient proxy 1 - 2 pi_t + sum pi^2 "
          "(verl 0.9.1's optimal_token_baseline)", OTBConfig, uses_model=True)
def otb(rollouts: Rollouts, probe: Probe, config: OTBConfig) -> Credit:
    mask = rollouts.trainable_mask()
    logprobs, squares = sampled_token_statistics(rollouts, probe, config.chunk_rows)
    token_rewards = torch.zeros_like(logprobs)
    T = mask.shape[1]
    last = T - 1 - mask.long().flip(-1).argmax(-1)  # the last trainable token
    has = mask.any(-1)
    rewards = rollouts.rewards.float().to(mask.device)  # verl's rows: rewards on the CPU, tokens on the GPU
    token_rewards[has, last[has]] = rewards[has]  # the outcome at the last token, as verl
    advantages = otb_advantages(token_rewards, mask, rollouts.group, logprobs, squares,
                                config.handle_zero_tail, config.epsilon)
    return Credit(advantages=advantages, info={"sum_pi_squared_mean": float((squares * mask).sum()
                                                                            / mask.sum().clamp(min=1))})
