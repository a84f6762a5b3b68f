"""RREDCoT: reward redistribution over CoT segments with the policy's own value, no generation.

Specification: docs/methods.md, "## RREDCoT". Segment k receives `R_k = V(s_k) - V(s_{k-1})`,
which telescopes to `r - V(s_0)`, so the return is preserved; V(s_K) := r. V comes from
credo.core.values: by default (`candidates=suffixes`) the importance-sampling value over the
group's own tails after each state plus the task's reference-solution tail, teacher-forced after
the state with the prefix KV cache reused (the IS lower bound, `probe=absolute`, by default);
`candidates=answers` is the forced-answer probe (`probe=normalized` by default).

Advantage modes (z = standardisation over all segments of the batch):
  additive (default) A_t = A_GRPO + lam * z(R_k)   [center=True, ours: z is centred per trace, so
                     the redistribution moves credit between a trace's segments and leaves its
                     total to GRPO; a one-segment trace gets exactly the GRPO advantage]
  replace            A_t = z(R_k)                  [one-segment traces keep A_GRPO, ours]
  weight             A_t = A_GRPO * w_t, w = clip(1 + lam * sign(A) * z(R), 0, w_max),
                     renormalised to mean 1 over each sequence's tokens
Defaults chosen by measurement on the shipped start (docs/results/audit-faithful/choose_lam.txt;
docs/methods.md, "### Choice of lam, centring and uniform groups"): lam=0.5 with centring gives the
highest share of steps whose advantage has the step's sign (0.858 vs 0.851 at lam=1, 0.847 at
0.25; uncentred 0.77) while halving the share of correct traces' segments pushed negative (0.070
vs 0.132 at lam=1); all-equal-reward groups are kept (skip_uniform_groups=False) because there
the suffix value finds the first error better than in mixed groups (top-1 0.875 vs 0.667; the
reference tail is what speaks), and skipping them leaves 55% of first errors without a negative
advantage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from credo.core.config import check
from credo.core.groups import group_mean_std, grpo_advantages, mean_one, rloo_advantages, zscore
from credo.credit.registry import register
from credo.core.values import VALUE_MODES, answer_values, step_differences, suffix_values
from credo.core.probe import Probe
from credo.core.rollouts import Credit, Rollouts
from credo.core.segment import broadcast_segments, check_segmenter_option, segments_for


@dataclass(frozen=True)
class RREDCoTConfig:
    """RREDCoT's value probe and how its segment credit shapes GRPO's advantage (module docstring)."""

    candidates: str = "suffixes"
    """What a state's value is read from: 'suffixes' (the group's own tails, the default) or 'answers' (a
    forced-answer probe)."""
    probe: str = ""
    """How candidate probabilities become a value (credo.core.values): 'normalized' or 'absolute'; '' = absolute
    for suffixes, normalized for answers (see `value_mode`)."""
    include_reference: bool = True
    """candidates=suffixes: add the task's reference-solution tail to the suffixes (when it has one; privileged)."""
    include_gold: bool = True
    """candidates=answers: add the gold answer to the answer candidates (privileged)."""
    v0: str = "probe"
    """V(s_0), the prompt's value: 'probe' (probed like every other state) or 'group_mean' (the mean reward of
    the row's other group members)."""
    mode: str = "additive"
    """How the standardised segment credit z shapes GRPO's advantage A: 'additive' (A + lam * z), 'replace'
    (z instead of A; a one-segment trace keeps A) or 'weight' (token weights 1 + lam * sign(A) * z, clipped to
    [0, w_max], mean 1 per trace)."""
    lam: float = 0.5
    """Strength of the redistribution, in [0, 100] (0: plain GRPO in additive and weight mode; unused by replace)."""
    w_max: float = 3.0
    """mode=weight: cap of a token weight, in [1, 100]."""
    center: bool = True
    """mode=additive: centre z per trace (mean 0 over its segments), so the shaping moves credit between a
    trace's segments rather than raising or lowering the trace as a whole."""
    skip_uniform_groups: bool = False
    """Groups whose rewards are all equal keep GRPO's advantage (0) and stay out of z's mean and std."""
    segmenter: Any = ""
    """The segments: '' = the batch's segments, cut by the task's own segmenter ('lines' on arith,
    'keyword_entropy' on free-form CoT); or a segmenter name or mapping of its own (credo.core.segment)."""
    reuse_prefix: bool = True
    """Score all candidates of a trace off one KV cache (false re-reads every prefix: same values, more cost)."""

    def __post_init__(self) -> None:
        check(self.candidates in ("suffixes", "answers"),
              f"credit.candidates must be 'suffixes' or 'answers', got {self.candidates!r}")
        check(self.probe in ("", *VALUE_MODES), f"credit.probe must be 'normalized' or 'absolute', got {self.probe!r}")
        check(self.v0 in ("probe", "group_mean"), f"credit.v0 must be 'probe' or 'group_mean', got {self.v0!r}")
        check(self.mode in ("additive", "replace", "weight"),
              f"credit.mode must be additive|replace|weight, got {self.mode!r}")
        check(0 <= self.lam <= 100, f"credit.lam must be in [0, 100], got {self.lam}")
        check(1 <= self.w_max <= 100, f"credit.w_max must be in [1, 100], got {self.w_max}")
        check_segmenter_option(self.segmenter)

    @property
    def value_mode(self) -> str:
        """The probe in force: suffixes default to the IS lower bound (absolute: the paper's estimator,
        measured as good at 1/3 of normalized's cost), answers to normalized (docs/methods.md)."""
        return self.probe or ("absolute" if self.candidates == "suffixes" else "normalized")


def reads_solution(config: RREDCoTConfig) -> bool:
    """Privileged (credo.credit.registry.EstimatorSpec): the reference-solution tail among the suffixes, or
    the gold answer among the forced answers."""
    return config.include_reference if config.candidates == "suffixes" else config.include_gold


def probe_values(rollouts: Rollouts, probe: Probe, segment_ids: torch.Tensor,
                 config: RREDCoTConfig) -> list[torch.Tensor]:
    """Per row, V(s_0..s_K) (K = its segment count; V(s_K) = r) by the configured value probe."""
    if config.candidates == "suffixes":
        values = suffix_values(rollouts, probe, segment_ids, config.value_mode, config.include_reference,
                               config.reuse_prefix)
    else:
        values = answer_values(rollouts, probe, segment_ids, config.value_mode,
                               config.include_gold, config.reuse_prefix)
    if config.v0 == "group_mean":  # leave-one-out: the row's own reward must not leak into R_1
        loo = rloo_advantages(rollouts.rewards, rollouts.group)
        for v, r, a in zip(values, rollouts.rewards, loo):
            v[0] = r - a
    return values


def advantages_from_redistribution(rollouts: Rollouts, segment_ids: torch.Tensor, R: list[torch.Tensor],
                                   config: RREDCoTConfig, gather: Any = None) -> torch.Tensor:
    """-> advantages[B, T] by the configured mode (weight mode folds its token weights into them). `gather`
    (Probe.gather) makes z's mean/std those of the whole batch when it is split into data-parallel shards."""
    a_grpo = grpo_advantages(rollouts.rewards, rollouts.group)
    live = [True] * len(R)
    if config.skip_uniform_groups:
        live = (group_mean_std(rollouts.rewards, rollouts.group)[1] > 1e-8).tolist()
    z = _standardise([r if keep else r[:0] for r, keep in zip(R, live)], gather)
    z = [zi if keep else torch.zeros_like(r) for zi, r, keep in zip(z, R, live)]
    mask = rollouts.trainable_mask().float()
    a_row = a_grpo.cpu()  # beside the per-segment values, which are on the CPU (broadcast_segments places them)
    if config.mode == "additive":
        shaped = [a_row[i] + config.lam * ((zi - zi.mean()) if config.center and zi.numel() else zi)
                  for i, zi in enumerate(z)]
        return broadcast_segments(shaped, segment_ids) * mask
    if config.mode == "replace":
        shaped = [zi if zi.numel() > 1 and live[i] else a_row[i].expand(zi.numel()) for i, zi in enumerate(z)]
        return broadcast_segments(shaped, segment_ids) * mask
    raw = [(1 + config.lam * torch.sign(a_row[i]) * zi).clamp(0, config.w_max) for i, zi in enumerate(z)]
    weights = mean_one(broadcast_segments(raw, segment_ids) * mask, mask)
    return a_grpo[:, None] * weights


def _standardise(R: list[torch.Tensor], gather: Any = None) -> list[torch.Tensor]:
    """z of every segment credit over all segments given (mean 0, std 1 over the batch; over every
    data-parallel shard's segments when `gather` is given)."""
    flat = torch.cat([r for r in R if r.numel()]) if any(r.numel() for r in R) else torch.zeros(0)
    flat = gather(flat) if gather is not None else flat
    return [zscore(r, over=flat) for r in R]


@register("rredcot",
          "RREDCoT: segment credit V(s_k) - V(s_{k-1}), V the policy's own IS value over its group's tails (+ "
          "reference), no generation",
          RREDCoTConfig, uses_model=True, needs_segments=True, privileged=reads_solution)
def rredcot(rollouts: Rollouts, probe: Probe, config: RREDCoTConfig) -> Credit:
    segment_ids = segments_for(rollouts, probe, config.segmenter)
    values = probe_values(rollouts, probe, segment_ids, config)
    R = step_differences(values)  # R_{i,k} = V(s_k) - V(s_{k-1}); sums to r_i - V(s_0)
    advantages = advantages_from_redistribution(rollouts, segment_ids, R, config, probe.gather)
    v0 = torch.stack([v[0] for v in values]) if values else torch.zeros(0)
    return Credit(advantages=advantages, segment_credit=R,
                  info={"v0_mean": float(v0.mean()) if v0.numel() else math.nan,
                        "segments_per_trace": float(sum(len(r) for r in R) / max(len(R), 1))})
