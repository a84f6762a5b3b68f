"""Monte Carlo state values (VinePPO / SPO-chain): the expensive ground truth, and estimators built on it.

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
from tqdm import tqdm

from credo.config import check
from credo.credit.registry import register
from credo.policy.base import left_pad
from credo.probe import Probe, prompt_tokens
from credo.rollouts import Credit, Rollouts
from credo.segment import broadcast_segments, segment_bounds, segmenter_config
from credo.tasks.base import rewards_for


@dataclass
class MCValues:
    """values[i]: V(s_0..s_{K_i}) of row i (the last entry is r_i); samples[i]: [K_i, k] rewards of the
    sampled continuations from s_0..s_{K_i - 1} (NaN rows for terminal prefixes)."""

    values: list[torch.Tensor]
    samples: list[torch.Tensor]

    def differences(self) -> list[torch.Tensor]:
        """Per row, the segment advantages V(s_k) - V(s_{k-1}), k = 1..K_i."""
        return [v[1:] - v[:-1] for v in self.values]


def mc_values(probe: Probe, rollouts: Rollouts, segment_ids: torch.Tensor, k: int, batch_size: int = 1024,
              progress: bool = False) -> MCValues:
    """MC values at every segment boundary of every row, with `k` continuations per boundary."""
    task = probe.task
    policy = probe.policy
    bounds = segment_bounds(segment_ids)
    jobs: list[tuple[int, int, list[int], str]] = []  # (row, state index j, prefix ids, prefix text)
    terminal: dict[tuple[int, int], float] = {}
    for row, segs in enumerate(bounds):
        prompt = prompt_tokens(rollouts.prompt_ids, rollouts.prompt_mask, row)
        completion = rollouts.completion_ids[row].tolist()
        for j in range(len(segs)):
            cut = 0 if j == 0 else segs[j - 1][1]
            text = policy.decode(torch.tensor(completion[:cut], dtype=torch.long))
            if j > 0 and task.extract_answer(text) is not None:
                terminal[(row, j)] = task.reward(rollouts.problems[row], text)
                continue
            jobs.append((row, j, prompt + completion[:cut], text))
    repeated = [job for job in jobs for _ in range(k)]
    rewards = torch.zeros(len(repeated))
    for start in tqdm(range(0, len(repeated), batch_size), desc=f"MC continuations (k={k})", disable=not progress,
                      unit="batch", dynamic_ncols=True):
        chunk = repeated[start:start + batch_size]
        ids, mask = left_pad([job[2] for job in chunk], policy.pad_id, rollouts.prompt_ids.device)
        out = probe.sample(ids, mask)
        texts = [job[3] + policy.decode(cont) for job, cont in zip(chunk, out.completion_ids)]
        rewards[start:start + len(chunk)] = rewards_for(task, [rollouts.problems[job[0]] for job in chunk], texts)[0]
    per_job = rewards.view(len(jobs), k) if jobs else torch.zeros(0, k)
    samples = [torch.full((len(segs), k), float("nan")) for segs in bounds]
    for index, (row, j, _, _) in enumerate(jobs):
        samples[row][j] = per_job[index]
    values = []
    for row, segs in enumerate(bounds):
        v = torch.zeros(len(segs) + 1)
        for j in range(len(segs)):
            v[j] = terminal[(row, j)] if (row, j) in terminal else samples[row][j].mean()
        v[len(segs)] = rollouts.rewards[row]
        values.append(v)
    return MCValues(values, samples)


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
    """k: continuations per segment boundary (VinePPO uses 9). segmenter: name or mapping (see
    credo.segment). batch_size: continuations sampled per forward batch. whiten: standardise the
    token advantages over the batch's trainable tokens, as VinePPO's trainer does before its loss
    (`whiten_advantages: true`); without it the MC step differences are ~4x smaller than GRPO's
    advantages. The audit turns it off (a positive affine map leaves its rank figures unchanged,
    and segment_credit stays the raw V(s_k) - V(s_{k-1}) either way)."""

    k: int = 9
    segmenter: Any = "lines"
    batch_size: int = 1024
    whiten: bool = True

    def __post_init__(self) -> None:
        check(self.k > 0, f"credit.k must be > 0, got {self.k}")
        check(self.batch_size > 0, f"credit.batch_size must be > 0, got {self.batch_size}")
        segmenter_config(self.segmenter)


@register("vineppo", "VinePPO-style MC: k continuations per segment boundary, A_k = V(s_k) - V(s_{k-1})",
          VinePPOConfig, uses_model=True, needs_segments=True)
def vineppo(rollouts: Rollouts, probe: Probe, config: VinePPOConfig) -> Credit:
    """Cost: k * (number of non-terminal boundaries) continuations per trace, each generated in full.
    VinePPO's code whitens per (distributed) mini-batch inside its loss; credo whitens once over the
    whole batch the credit is computed for."""
    segment_ids = probe.segment(rollouts, config.segmenter)
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
    """k: continuations per cutpoint. p: a token is a cutpoint (and gets gradient) when its old
    probability is below p. every: keep every m-th cutpoint as a segment boundary."""

    k: int = 4
    p: float = 0.9
    every: int = 1
    batch_size: int = 1024

    def __post_init__(self) -> None:
        check(self.k > 0, f"credit.k must be > 0, got {self.k}")
        check(0 < self.p <= 1, f"credit.p must be in (0, 1], got {self.p}")
        check(self.every > 0, f"credit.every must be > 0, got {self.every}")


@register("spo_chain", "SPO-chain: MC values at low-probability cutpoints; gradient only on tokens with p_old < 0.9",
          SPOChainConfig, uses_model=True, needs_segments=True)
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
                  info={"masked_token_share": float(probability_mask.sum() / rollouts.completion_mask.sum().clamp(min=1))})
