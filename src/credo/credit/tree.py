"""Prefix-tree credit from the group, no extra rollouts: TEMPO-style values and lambda-GRPO weights.

Specification: docs/methods.md, "## Prefix-tree credit (TEMPO, lambda-GRPO)". The G completions of a
prompt form a token trie: the node of row i after its token t is the set S_{i,t} of the group's rows
whose completions agree with row i on tokens 0..t (the root, before any token, is the whole group).
  V_{i,t} = mean reward over S_{i,t}                 (the prefix's value: the mean over its descendants)
  d_{i,t} = V_{i,t} - V_{i,t-1},  V_{i,-1} = group mean   (zero wherever the trie does not branch)
  tempo        A_{i,t} = (r_i - mean_g + lam * d_{i,t}) / (std_g + eps)    (GRPO's scale; `scale=false`: none)
               `at=segments`: d is taken between segment ends and given to every token of the segment
  lambda_grpo  A_{i,t} = A_i^GRPO, token weight w_{i,t} = |S_{i,t}|^(-lam)  (lam=1: a prefix shared by n
               members counts once in all, as the public code coli-saar/grpo-prm weights it)
Both read only token ids, rewards and group ids: they run wherever GRPO runs (uses_model=False).
`tempo:of=<m>` adds the same lam * d_{i,t} / (std_g + eps) to m's advantages instead of GRPO's (credo.credit.compose);
it then needs what m needs (a Probe, when m uses the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from credo.core.config import check
from credo.core.groups import GroupNormConfig, group_mean_std, grpo_advantages
from credo.credit.compose import Wrapping, check_wrapped, wrapped_credit, wrapped_privileged
from credo.credit.registry import register
from credo.core.rollouts import Credit, Rollouts
from credo.core.segment import broadcast_segments, check_segmenter_option, segment_bounds, segments_for


def prefix_nodes(completion_ids: torch.Tensor, completion_mask: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """completion_ids[B, T], completion_mask[B, T] (right-padded), group[B] -> nodes[B, T]: the id of the
    trie node each row reaches after each of its tokens (rows of one group share a node exactly while
    their completions agree so far; different groups never share one), -1 on padding."""
    B, T = completion_ids.shape
    nodes = torch.full((B, T), -1, dtype=torch.long, device=completion_ids.device)
    if B == 0:
        return nodes
    parent = torch.unique(group.to(completion_ids.device), return_inverse=True)[1]  # the root of each group
    next_id = int(parent.max()) + 1
    width = int(completion_ids.max()) + 1 if completion_ids.numel() else 1
    for t in range(T):
        live = completion_mask[:, t].bool()
        if not bool(live.any()):
            break
        # a child is (parent node, token): rows with equal keys stay on one node
        keys = parent[live] * width + completion_ids[live, t].long()
        unique, inverse = torch.unique(keys, return_inverse=True)
        nodes[live, t] = inverse + next_id
        next_id += len(unique)
        parent = parent.clone()
        parent[live] = nodes[live, t]
    return nodes


def node_statistics(nodes: torch.Tensor, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """nodes[B, T] (prefix_nodes), rewards[B] -> (values[B, T], counts[B, T]): the mean reward and the
    number of rows through each token's node (0 on padding)."""
    live = nodes >= 0
    size = int(nodes.max()) + 1 if bool(live.any()) else 0
    flat = nodes[live]
    per_token_reward = rewards.to(nodes.device, torch.float64)[:, None].expand_as(nodes)[live]
    counts = torch.bincount(flat, minlength=size).to(torch.float64)
    sums = torch.zeros(size, dtype=torch.float64, device=nodes.device).index_add_(0, flat, per_token_reward)
    values = torch.zeros(nodes.shape, dtype=torch.float64, device=nodes.device)
    n = torch.zeros(nodes.shape, dtype=torch.float64, device=nodes.device)
    values[live] = sums[flat] / counts[flat]
    n[live] = counts[flat]
    return values.float(), n.float()


def prefix_values(rollouts: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
    """(V[B, T], |S|[B, T]) of the batch's group tries (module docstring), 0 on padding."""
    nodes = prefix_nodes(rollouts.completion_ids, rollouts.completion_mask, rollouts.group)
    return node_statistics(nodes, rollouts.rewards)


def value_changes(values: torch.Tensor, mask: torch.Tensor, group_mean: torch.Tensor) -> torch.Tensor:
    """values[B, T] = V_{i,t}, mask[B, T], group_mean[B] -> d[B, T] = V_{i,t} - V_{i,t-1} (V_{i,-1} = the
    group mean), 0 on padding. Summed over a row: V at its last token minus the group mean."""
    previous = torch.cat([group_mean[:, None].to(values.dtype), values[:, :-1]], dim=1)
    return (values - previous) * mask.to(values.dtype)


def segment_changes(values: torch.Tensor, segment_ids: torch.Tensor, group_mean: torch.Tensor) -> list[torch.Tensor]:
    """Per row, d_k = V at the last token of segment k minus V at the last token of segment k-1 (the group
    mean before segment 0): the trie's value change across each segment."""
    out = []
    for row, bounds in enumerate(segment_bounds(segment_ids)):
        ends = torch.stack([values[row, b - 1] for _, b in bounds]) if bounds else torch.zeros(0)
        before = torch.cat([group_mean[row].reshape(1).to(ends.dtype), ends[:-1]]) if bounds else ends
        out.append(ends - before)
    return out


@dataclass(frozen=True)
class TempoConfig(GroupNormConfig, Wrapping):
    """TEMPO-style prefix-tree credit (docs/methods.md, "## Prefix-tree credit")."""

    lam: float = 1.0
    """Weight of the trie's value change d_{i,t} added to GRPO's r_i - mean, or to the wrapped method's credit
    with of= (0: plain GRPO, or that credit unchanged)."""
    at: str = "tokens"
    """'tokens': d at the token where the trie branches; 'segments': d between segment ends, on every token
    of the segment (the trie read at step boundaries)."""
    scale: bool = True
    """Divide by the group's reward std + eps, as GRPO does (false: Dr. GRPO's unscaled centring)."""
    segmenter: Any = ""
    """With at=segments: '' = the batch's segments (the task's own segmenter), or a segmenter of its own."""
    of: str = field(default="", metadata={"omit_default": True})
    """The credit the trie's term is added to: '' = GRPO's (r_i - mean) / (std + eps), TEMPO; or any registered
    estimator (credo.credit.compose): its advantages + lam * d / (std + eps), its token weights kept
    (`tempo:of=rredcot`: RREDCoT's segment credit plus the group's own branch evidence, free)."""
    options: dict = field(default_factory=dict, metadata={"omit_default": True})
    """The wrapped method's options; any key not named here lands in it."""

    def __post_init__(self) -> None:
        super().__post_init__()  # std, eps
        check(0 <= self.lam <= 100, f"credit.lam must be in [0, 100], got {self.lam}")
        check(self.at in ("tokens", "segments"), f"credit.at must be 'tokens' or 'segments', got {self.at!r}")
        check_segmenter_option(self.segmenter)
        check_wrapped("tempo", self.of, self.options)


def _group_scale(rollouts: Rollouts, config: TempoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(group mean[B], divisor[B]): std + eps where the group's rewards differ (0 marks a uniform group)."""
    device = rollouts.completion_ids.device  # verl's rows: rewards and groups on the CPU, tokens on the GPU
    mean, sd = group_mean_std(rollouts.rewards.float().to(device), rollouts.group.to(device),
                              unbiased=config.std == "sample")
    divisor = sd + config.eps if config.scale else torch.ones_like(sd)
    return mean, torch.where(sd > 1e-8, divisor, torch.zeros_like(sd))


@register("tempo", "TEMPO-style: GRPO + the change of the group trie's prefix value (mean reward of the "
          "completions sharing the prefix) where the trie branches; no extra rollouts (of=<method>: added to that "
          "method's credit)", TempoConfig, privileged=wrapped_privileged,
          needs_segments=lambda config: config.at == "segments")
def tempo(rollouts: Rollouts, probe: Any, config: TempoConfig) -> Credit:
    mask = rollouts.trainable_mask().float()
    values, counts = prefix_values(rollouts)
    mean, divisor = _group_scale(rollouts, config)
    live = divisor > 0
    safe = torch.where(live, divisor, torch.ones_like(divisor))
    if config.at == "tokens":
        change = value_changes(values, rollouts.completion_mask, mean)
    else:
        segment_ids = segments_for(rollouts, probe, config.segmenter)
        change = broadcast_segments(segment_changes(values, segment_ids, mean), segment_ids)
    base = wrapped_credit(config.of, config.options, rollouts, probe)[0] if config.of else None
    outcome = (rollouts.rewards.float().to(mean.device) - mean)[:, None]
    raw = (torch.zeros_like(outcome) if base is not None else outcome) + config.lam * change
    advantages = torch.where(live[:, None], raw / safe[:, None], torch.zeros_like(raw)) * mask
    real = rollouts.completion_mask
    info = {"branch_token_share": float(((change.abs() > 0) & real).sum() / real.sum().clamp(min=1)),
            "shared_token_share": float(((counts > 1) & real).sum() / real.sum().clamp(min=1))}
    if base is None:
        return Credit(advantages=advantages, info=info)
    return Credit(advantages=base.advantages + advantages, weights=base.weights, loss_mask=base.loss_mask,
                  info={**base.info, **info})


@dataclass(frozen=True)
class LambdaGRPOConfig(GroupNormConfig):
    """lambda-GRPO: GRPO with shared prefixes down-weighted (docs/methods.md, "## Prefix-tree credit")."""

    lam: float = 1.0
    """Exponent of the weight |S_{i,t}|^(-lam) of a token shared by |S| members (1: the public code; 0: GRPO)."""

    def __post_init__(self) -> None:
        super().__post_init__()  # std, eps
        check(0 <= self.lam <= 10, f"credit.lam must be in [0, 10], got {self.lam}")


@register("lambda_grpo", "lambda-GRPO: GRPO with each token weighted by 1 / (members of its group sharing its "
          "prefix)^lam, so a shared prefix counts once; no extra rollouts", LambdaGRPOConfig)
def lambda_grpo(rollouts: Rollouts, probe: Any, config: LambdaGRPOConfig) -> Credit:
    mask = rollouts.trainable_mask().float()
    _, counts = prefix_values(rollouts)
    weights = counts.clamp(min=1).pow(-config.lam) * mask
    adv = grpo_advantages(rollouts.rewards.float(), rollouts.group, std=config.std, eps=config.eps).to(mask.device)
    real = rollouts.completion_mask
    return Credit(advantages=adv[:, None] * mask, weights=weights,
                  info={"shared_token_share": float(((counts > 1) & real).sum() / real.sum().clamp(min=1))})
