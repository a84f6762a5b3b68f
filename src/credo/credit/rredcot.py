"""RREDCoT: reward redistribution over CoT segments with the policy's own forced-answer value.

RUDDER applied to chains of thought: segment k receives `R_k = V(s_k) - V(s_{k-1})`, which
telescopes to `r - V(s_0)`, so the return is preserved. V comes from the policy itself, with no
generation: a task-given answer template T is appended to the prefix s_k and each candidate
answer a (the distinct final answers of the group, plus the gold answer when known) is teacher
forced after it; A+ are the candidates the verifier accepts.
  probe=normalized (default): V = sum_{A+} pi(a | s_k + T) / sum_{A} pi(a | s_k + T)
  probe=absolute:             V = sum_{A+} pi(T + a | s_k)   (the importance-sampling lower bound)
Both lie in [0, 1] (distinct EOS-terminated answers are disjoint events). V(s_K) := r;
V(s_0) from the probe on the prompt (v0=probe) or the group's mean reward (v0=group_mean).

Advantage modes (z = standardisation over all segments of the batch):
  additive (default) A_t = A_GRPO + lam * z(R_k)   [center=True, ours: z is centred per trace, so
                     the redistribution moves credit between a trace's segments and leaves its
                     total to GRPO; a one-segment trace gets exactly the GRPO advantage]
  replace            A_t = z(R_k)                  [one-segment traces keep A_GRPO, ours]
  weight             A_t = A_GRPO * w_t, w = clip(1 + lam * sign(A) * z(R), 0, w_max),
                     renormalised to mean 1 over each sequence's tokens
Cost: with prefix reuse one pass over prompt + completion per trace plus |T + a| tokens per
(boundary, candidate), i.e. T + K * |T + a|; identical prefixes (s_0 of a group) are scored once.
`candidates=suffixes` of METHODS.md (group tails as the proposal) is not implemented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from credo.config import check
from credo.credit.outcome import grpo_advantages
from credo.credit.registry import register
from credo.probe import Probe
from credo.rollouts import Credit, Rollouts
from credo.segment import broadcast_segments, segment_bounds, segmenter_config


@dataclass(frozen=True)
class RREDCoTConfig:
    """probe: normalized | absolute. v0: probe | group_mean. mode: additive | replace | weight.
    lam: strength of the redistribution. w_max: weight cap (weight mode). center: centre z per
    trace in additive mode. segmenter: name or mapping ('lines' on arith; 'keyword_entropy' on
    free-form CoT). include_gold: add the task's gold answer to the candidates. reuse_prefix: score
    all probes of a trace off one KV cache (False re-reads every prefix; same values, more cost)."""

    probe: str = "normalized"
    v0: str = "probe"
    mode: str = "additive"
    lam: float = 1.0
    w_max: float = 3.0
    center: bool = True
    segmenter: Any = "lines"
    include_gold: bool = True
    reuse_prefix: bool = True

    def __post_init__(self) -> None:
        check(self.probe in ("normalized", "absolute"), f"credit.probe must be 'normalized' or 'absolute', got {self.probe!r}")
        check(self.v0 in ("probe", "group_mean"), f"credit.v0 must be 'probe' or 'group_mean', got {self.v0!r}")
        check(self.mode in ("additive", "replace", "weight"), f"credit.mode must be additive|replace|weight, got {self.mode!r}")
        check(self.lam >= 0, f"credit.lam must be >= 0, got {self.lam}")
        check(self.w_max >= 1, f"credit.w_max must be >= 1, got {self.w_max}")
        segmenter_config(self.segmenter)


def candidate_answers(rollouts: Rollouts, task: Any, include_gold: bool) -> dict[int, list[tuple[str, bool]]]:
    """Per group id: the distinct final answers of its members (+ gold), each with its verdict."""
    out: dict[int, list[tuple[str, bool]]] = {}
    for row, (g, problem, text) in enumerate(zip(rollouts.group.tolist(), rollouts.problems, rollouts.completions)):
        seen = out.setdefault(g, [])
        found = [task.extract_answer(text)]
        if include_gold and getattr(problem, "answer", None):
            found.append(problem.answer)
        for answer in found:
            if answer is not None and all(answer != a for a, _ in seen):
                seen.append((answer, bool(task.check_answer(problem, answer))))
    return out


def probe_values(rollouts: Rollouts, probe: Probe, segment_ids: torch.Tensor, config: RREDCoTConfig) -> list[torch.Tensor]:
    """Per row, V(s_0..s_K) (K = its segment count; V(s_K) = r). See the module docstring."""
    task, policy = probe.task, probe.policy
    bounds = segment_bounds(segment_ids)
    candidates = candidate_answers(rollouts, task, config.include_gold)
    group = rollouts.group.tolist()
    encoded: dict[tuple[int, str], tuple[list[int], int]] = {}  # (group, answer) -> (tokens of T + a, |T|)
    branches: list[tuple[int, int, list[int]]] = []
    slots: dict[tuple, int] = {}  # (group, prefix tokens, answer) -> branch index: identical prefixes scored once
    lookups: list[list[list[int | None]]] = []  # row -> state j -> candidate -> branch index
    for row, segs in enumerate(bounds):
        completion = rollouts.completion_ids[row].tolist()
        per_state = []
        for j in range(len(segs)):
            if j == 0 and config.v0 == "group_mean":
                per_state.append([])
                continue
            cut = 0 if j == 0 else segs[j - 1][1]
            prefix_key = tuple(completion[:cut])
            per_candidate = []
            for answer, _ in candidates.get(group[row], []):
                if (group[row], answer) not in encoded:
                    template, text = task.answer_probe(answer)
                    encoded[(group[row], answer)] = (policy.encode_continuation(template + text, eos=True),
                                                     len(policy.encode_continuation(template, eos=False)))
                key = (group[row], prefix_key, answer)
                if key not in slots:
                    slots[key] = len(branches)
                    branches.append((row, cut, encoded[(group[row], answer)][0]))
                per_candidate.append(slots[key])
            per_state.append(per_candidate)
        lookups.append(per_state)
    scored = probe.score_branches(rollouts, branches, reuse_prefix=config.reuse_prefix)
    group_mean = _group_means(rollouts)
    values = []
    for row, segs in enumerate(bounds):
        cands = candidates.get(group[row], [])
        v = torch.zeros(len(segs) + 1)
        for j in range(len(segs)):
            if j == 0 and config.v0 == "group_mean":
                v[0] = group_mean[row]
                continue
            v[j] = _value([scored[b] for b in lookups[row][j]], cands, encoded, group[row], config.probe)
        v[len(segs)] = rollouts.rewards[row]
        values.append(v)
    return values


def _value(logprobs: list[torch.Tensor], candidates: list[tuple[str, bool]], encoded: dict, g: int, mode: str) -> float:
    if not candidates or not any(ok for _, ok in candidates):
        return 0.0
    if mode == "absolute":
        total = torch.stack([lp.sum() for lp in logprobs])
    else:
        total = torch.stack([lp[encoded[(g, a)][1]:].sum() for lp, (a, _) in zip(logprobs, candidates)])
    good = torch.tensor([ok for _, ok in candidates])
    if mode == "absolute":
        return float(total[good].exp().sum().clamp(max=1.0))
    return float(torch.exp(torch.logsumexp(total[good], 0) - torch.logsumexp(total, 0)))


def _group_means(rollouts: Rollouts) -> torch.Tensor:
    from credo.credit.outcome import group_mean_std
    return group_mean_std(rollouts.rewards, rollouts.group)[0]


def redistribute(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """R_{i,k} = V(s_k) - V(s_{k-1}); sums to r_i - V(s_0) by construction."""
    return [v[1:] - v[:-1] for v in values]


def advantages_from_redistribution(rollouts: Rollouts, segment_ids: torch.Tensor, R: list[torch.Tensor],
                                   config: RREDCoTConfig, gather: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """-> (advantages[B, T], weights[B, T] or None) by the configured mode. `gather` (Probe.gather) makes
    z's mean/std those of the whole batch when it is split into data-parallel shards."""
    a_grpo = grpo_advantages(rollouts.rewards, rollouts.group)
    flat = torch.cat([r for r in R if r.numel()]) if any(r.numel() for r in R) else torch.zeros(0)
    flat = gather(flat) if gather is not None else flat
    mu = flat.mean() if flat.numel() else torch.tensor(0.0)
    sd = flat.std() if flat.numel() > 1 else torch.tensor(0.0)
    z = [((r - mu) / sd if float(sd) > 1e-8 else torch.zeros_like(r)) for r in R]
    mask = rollouts.trainable_mask().float()
    if config.mode == "additive":
        shaped = [a_grpo[i] + config.lam * ((zi - zi.mean()) if config.center and zi.numel() else zi) for i, zi in enumerate(z)]
        return broadcast_segments(shaped, segment_ids) * mask, None
    if config.mode == "replace":
        shaped = [zi if zi.numel() > 1 else a_grpo[i].expand(zi.numel()) for i, zi in enumerate(z)]
        return broadcast_segments(shaped, segment_ids) * mask, None
    raw = [(1 + config.lam * torch.sign(a_grpo[i]) * zi).clamp(0, config.w_max) for i, zi in enumerate(z)]
    weights = broadcast_segments(raw, segment_ids) * mask
    per_seq = weights.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    weights = torch.where(per_seq > 0, weights / per_seq.clamp(min=1e-8), mask)
    return a_grpo[:, None] * weights, None


@register("rredcot", "RREDCoT: segment credit V(s_k) - V(s_{k-1}) from the policy's own forced-answer probe, no generation",
          RREDCoTConfig, uses_model=True, needs_segments=True)
def rredcot(rollouts: Rollouts, probe: Probe, config: RREDCoTConfig) -> Credit:
    segment_ids = probe.segment(rollouts, config.segmenter)
    values = probe_values(rollouts, probe, segment_ids, config)
    R = redistribute(values)
    advantages, weights = advantages_from_redistribution(rollouts, segment_ids, R, config, probe.gather)
    v0 = torch.stack([v[0] for v in values]) if values else torch.zeros(0)
    return Credit(advantages=advantages, weights=weights, segment_credit=R,
                  info={"v0_mean": float(v0.mean()) if v0.numel() else math.nan,
                        "segments_per_trace": float(sum(len(r) for r in R) / max(len(R), 1))})
