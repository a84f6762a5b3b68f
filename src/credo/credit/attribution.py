"""Attribution baselines that RREDCoT is compared with: loo, shapley, counterfactual, oar.

All four read the same signal, the policy's answer log-likelihood after a context:
`f(context) = log pi(T + a | prompt + context)`, with T the task's answer template and a the
target answer (`target=gold`, default: the verified answer, so a segment that lowers the chance of
the right answer gets negative credit; `target=own`: the trace's own final answer). The players
are the completion's segments except a final answer segment (the segment stating the answer is
what is probed; it gets neutral credit 0, or weight 1). Contexts are scored in plain batches
(each removal changes every later position, so there is no prefix to reuse past the removal);
the Credit cost counts every token forwarded.

- loo: segment score f(all) - f(all without k) (AttriBoT leave-one-out). `coarse_to_fine=b`
  first removes blocks of b segments and refines only the `refine_top` blocks with the largest
  |score| (the other segments share their block's score): fewer evaluations on long traces.
  Cost: (n + 1) evaluations per trace (fewer with coarse-to-fine).
- shapley: permutation-sampling Shapley values of the segments for f, `permutations` random
  orders, each costing n evaluations (plus f(empty), f(all)). Every sampled permutation telescopes,
  so the values sum to f(all) - f(empty) exactly (efficiency).
- counterfactual (2602.09331): importance of segment k = f(all) - f(all without k); per trace,
  sign(A) * importance is min-max normalised to u in [0, 1] and mapped to token weights
  w = 0.5 + 1.5 u in [0.5, 2]; A_t = A_GRPO * w. Cost as loo.
- oar (2601.07408): importance of a unit (token, or segment with unit=segment) = KL between the
  distribution over the group's candidate answers with and without it; u = importance / max;
  w = max(u / 0.25, 0.1) if u < 0.25 else 1 + (u - 0.25) / 0.75, rescaled to mean 1 per trace
  (mass preserved); A_t = A_GRPO * w. Cost: (units + 1) x candidates evaluations per trace.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from credo.core.config import check
from credo.core.groups import grpo_advantages, mean_one
from credo.credit.registry import register
from credo.core.values import candidate_answers
from credo.core.protocols import left_pad
from credo.policy.base import right_pad, strip_eos
from credo.core.probe import Probe, prompt_tokens
from credo.core.rollouts import Credit, Rollouts
from credo.core.segment import broadcast_segments, check_segmenter_option, segment_bounds, segments_for


@dataclass(frozen=True)
class AttributionConfig:
    """The options of loo, shapley, counterfactual and oar (module docstring); each reads those it needs."""

    segmenter: Any = ""
    """The players: '' = the batch's segments (the task's own segmenter), or a segmenter name or mapping of
    its own (credo.core.segment)."""
    target: str = "gold"
    """The answer whose log-likelihood f scores: 'gold' (the verified answer; privileged) or 'own' (the trace's
    own final answer). oar scores the group's candidate answers, the gold one among them, whatever it says."""
    batch_size: int = 512
    """Contexts scored per forward pass (>= 1; bounds memory, not results)."""
    coarse_to_fine: int = 0
    """loo only: > 1 first removes blocks of this many segments and refines only the top blocks (0 or 1: every
    segment removed on its own)."""
    refine_top: int = 1
    """loo with coarse_to_fine: the blocks with the largest |score| that are refined segment by segment (>= 1)."""
    permutations: int = 8
    """shapley only: random segment orders sampled per trace (>= 1), each costing one evaluation per segment."""
    seed: int = 0
    """shapley only: seed of the permutation orders (the same orders on every call)."""
    unit: str = "token"
    """oar only: what is removed to measure importance, 'token' (the paper's) or 'segment' (far cheaper)."""

    def __post_init__(self) -> None:
        check_segmenter_option(self.segmenter)
        check(self.target in ("gold", "own"), f"credit.target must be 'gold' or 'own', got {self.target!r}")
        check(self.batch_size > 0, f"credit.batch_size must be > 0, got {self.batch_size}")
        check(self.coarse_to_fine >= 0 and self.refine_top >= 1,
              "credit.coarse_to_fine must be >= 0 and credit.refine_top >= 1")
        check(self.permutations >= 1, f"credit.permutations must be >= 1, got {self.permutations}")
        check(self.unit in ("token", "segment"), f"credit.unit must be 'token' or 'segment', got {self.unit!r}")


@dataclass
class Players:
    """Per row: completion tokens, player spans [(start, end)), whether the last segment is an answer."""

    tokens: list[list[int]]
    spans: list[list[tuple[int, int]]]
    n_segments: list[int]


def players(rollouts: Rollouts, probe: Probe, config: AttributionConfig) -> tuple[torch.Tensor, Players]:
    segment_ids = segments_for(rollouts, probe, config.segmenter)
    bounds = segment_bounds(segment_ids)
    tokens, spans = [], []
    for row, segs in enumerate(bounds):
        completion = rollouts.completion_ids[row][rollouts.completion_mask[row]].tolist()
        ids = strip_eos(completion, probe.policy.eos_id)
        tokens.append(ids)
        last_text = probe.policy.decode(torch.tensor(ids[segs[-1][0]:] if segs else [], dtype=torch.long))
        keep = segs[:-1] if segs and probe.task.extract_answer(last_text) is not None else segs
        spans.append([(a, min(b, len(ids))) for a, b in keep])
    return segment_ids, Players(tokens, spans, [len(b) for b in bounds])


def target_tokens(rollouts: Rollouts, probe: Probe, row: int, target: str) -> list[int] | None:
    problem = rollouts.problems[row]
    answer = problem.answer if target == "gold" else probe.task.extract_answer(rollouts.completions[row])
    if answer is None:
        answer = problem.answer
    template, text = probe.task.answer_probe(answer)
    return probe.policy.encode_continuation(template + text, eos=True)


def score_contexts(rollouts: Rollouts, probe: Probe, jobs: Sequence[tuple[int, list[int], list[int]]],
                   batch_size: int) -> torch.Tensor:
    """jobs: (row, context tokens, continuation tokens) -> log pi(continuation | prompt + context) [N]."""
    out = torch.zeros(len(jobs))
    pad = probe.policy.pad_id
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        p_ids, p_mask = left_pad([prompt_tokens(rollouts.prompt_ids, rollouts.prompt_mask, r) + ctx
                                  for r, ctx, _ in chunk],
                                 pad, rollouts.prompt_ids.device)
        c_ids, c_mask = right_pad([cont for _, _, cont in chunk], pad, rollouts.prompt_ids.device)
        logprobs, _ = probe.score(p_ids, p_mask, c_ids, c_mask)
        out[start:start + len(chunk)] = logprobs.sum(1)
    return out


def context_without(tokens: list[int], spans: list[tuple[int, int]], removed: set[int]) -> list[int]:
    """Completion tokens with the removed players' spans cut out (tokens outside every span stay)."""
    drop = set()
    for k in removed:
        a, b = spans[k]
        drop.update(range(a, b))
    return [t for i, t in enumerate(tokens) if i not in drop]


def _segment_scores_to_credit(rollouts: Rollouts, segment_ids: torch.Tensor, pl: Players,
                              scores: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Scores of the players -> per-segment credit (0 for a trailing answer segment) and [B, T] advantages."""
    per_segment = []
    for row, s in enumerate(scores):
        full = torch.zeros(pl.n_segments[row])
        full[:len(s)] = s
        per_segment.append(full)
    return broadcast_segments(per_segment, segment_ids) * rollouts.trainable_mask(), per_segment


def loo_scores(rollouts: Rollouts, probe: Probe, pl: Players, config: AttributionConfig) -> list[torch.Tensor]:
    jobs: list[tuple[int, list[int], list[int]]] = []
    plan: list[tuple[int, str, Any]] = []
    for row in range(rollouts.batch_size):
        target = target_tokens(rollouts, probe, row, config.target)
        n = len(pl.spans[row])
        jobs.append((row, pl.tokens[row], target))
        plan.append((row, "full", None))
        units = [[k] for k in range(n)]
        if config.coarse_to_fine > 1 and n > config.coarse_to_fine:
            units = [list(range(a, min(a + config.coarse_to_fine, n))) for a in range(0, n, config.coarse_to_fine)]
        for unit in units:
            jobs.append((row, context_without(pl.tokens[row], pl.spans[row], set(unit)), target))
            plan.append((row, "unit", unit))
    values = score_contexts(rollouts, probe, jobs, config.batch_size)
    scores = [torch.zeros(len(s)) for s in pl.spans]
    full = {}
    blocks: dict[int, list[tuple[list[int], float]]] = {}
    for v, (row, kind, unit) in zip(values.tolist(), plan):
        if kind == "full":
            full[row] = v
        else:
            blocks.setdefault(row, []).append((unit, full[row] - v))
    refine: list[tuple[int, list[int], list[int], int]] = []
    for row, items in blocks.items():
        for unit, score in items:
            for k in unit:
                scores[row][k] = score / len(unit)
        if any(len(u) > 1 for u, _ in items):
            top = sorted(items, key=lambda x: -abs(x[1]))[:config.refine_top]
            for unit, _ in top:
                for k in unit:
                    refine.append((row, context_without(pl.tokens[row], pl.spans[row], {k}),
                                   target_tokens(rollouts, probe, row, config.target), k))
    if refine:
        fine = score_contexts(rollouts, probe, [(r, c, t) for r, c, t, _ in refine], config.batch_size)
        for v, (row, _, _, k) in zip(fine.tolist(), refine):
            scores[row][k] = full[row] - v
    return scores


def reads_gold(config: AttributionConfig) -> bool:
    """Privileged (credo.credit.registry.EstimatorSpec): `target=gold` forces the task's gold answer."""
    return config.target == "gold"


@register("loo", "Leave-one-segment-out change in the answer log-likelihood (AttriBoT-style; coarse-to-fine option)",
          AttributionConfig, uses_model=True, needs_segments=True, privileged=reads_gold)
def loo(rollouts: Rollouts, probe: Probe, config: AttributionConfig) -> Credit:
    """Needs: the answer template and target answer. Cost: (segments + 1) forwards per trace."""
    segment_ids, pl = players(rollouts, probe, config)
    advantages, per_segment = _segment_scores_to_credit(rollouts, segment_ids, pl,
                                                        loo_scores(rollouts, probe, pl, config))
    return Credit(advantages=advantages, segment_credit=per_segment)


def shapley_values(rollouts: Rollouts, probe: Probe, pl: Players,
                   config: AttributionConfig) -> tuple[list[torch.Tensor], list[tuple[float, float]]]:
    """Per row: Shapley estimates [n_players] and (f(empty), f(all))."""
    rng = random.Random(config.seed)
    jobs, plan = [], []
    for row in range(rollouts.batch_size):
        target = target_tokens(rollouts, probe, row, config.target)
        n = len(pl.spans[row])
        for _ in range(config.permutations if n > 1 else 1):
            order = list(range(n))
            rng.shuffle(order)
            present: set[int] = set()
            chain = [frozenset()]
            for k in order:
                present.add(k)
                chain.append(frozenset(present))
            plan.append((row, order, chain))
            for subset in chain:
                jobs.append((row, context_without(pl.tokens[row], pl.spans[row], set(range(n)) - subset), target))
    values = score_contexts(rollouts, probe, jobs, config.batch_size).tolist()
    sums = [torch.zeros(len(s)) for s in pl.spans]
    counts = [0] * rollouts.batch_size
    ends: list[tuple[float, float]] = [(0.0, 0.0)] * rollouts.batch_size
    cursor = 0
    for row, order, chain in plan:
        f = values[cursor:cursor + len(chain)]
        cursor += len(chain)
        for position, k in enumerate(order):
            sums[row][k] += f[position + 1] - f[position]
        counts[row] += 1
        ends[row] = (f[0], f[-1])
    return [s / max(c, 1) for s, c in zip(sums, counts)], ends


@register("shapley",
          "Permutation-sampling Shapley values of segments for the answer log-likelihood (sum to f(all) - f(empty))",
          AttributionConfig, uses_model=True, needs_segments=True, privileged=reads_gold)
def shapley(rollouts: Rollouts, probe: Probe, config: AttributionConfig) -> Credit:
    """Needs: the answer template and target. Cost: permutations x (segments + 1) forwards per trace."""
    segment_ids, pl = players(rollouts, probe, config)
    values, _ = shapley_values(rollouts, probe, pl, config)
    advantages, per_segment = _segment_scores_to_credit(rollouts, segment_ids, pl, values)
    return Credit(advantages=advantages, segment_credit=per_segment)


@register("counterfactual",
          "Causal credit: drop in answer log-prob when a segment is removed, as token weights in [0.5, 2] on GRPO",
          AttributionConfig, uses_model=True, needs_segments=True, privileged=reads_gold)
def counterfactual(rollouts: Rollouts, probe: Probe, config: AttributionConfig) -> Credit:
    """Needs: the answer template and target. Cost: (segments + 1) forwards per trace."""
    segment_ids, pl = players(rollouts, probe, config)
    importance = loo_scores(rollouts, probe, pl, config)
    a_grpo = grpo_advantages(rollouts.rewards, rollouts.group)
    a_row = a_grpo.cpu()  # beside the per-segment scores, which are on the CPU (broadcast_segments places them)
    weights = []
    for row, imp in enumerate(importance):
        w = torch.ones(pl.n_segments[row])
        if imp.numel():
            signed = torch.sign(a_row[row]) * imp
            spread = signed.max() - signed.min()
            u = (signed - signed.min()) / spread if float(spread) > 0 else torch.full_like(signed, 0.5)
            w[:len(imp)] = 0.5 + 1.5 * u
        weights.append(w)
    dense_w = broadcast_segments(weights, segment_ids) * rollouts.trainable_mask()
    advantages = a_grpo[:, None] * dense_w
    return Credit(advantages=advantages, segment_credit=[a_row[i] * w for i, w in enumerate(weights)])


def oar_weights(u: torch.Tensor) -> torch.Tensor:
    """OAR's bi-level reshaping of normalised importance u in [0, 1] (before mass preservation)."""
    return torch.where(u < 0.25, (u / 0.25).clamp(min=0.1), 1 + (u - 0.25) / 0.75)


@register("oar",
          "Outcome-grounded reshaping: KL of the answer distribution with/without each token -> "
          "bi-level weights on GRPO",
          AttributionConfig, uses_model=True, needs_segments=True, privileged=reads_gold)
def oar(rollouts: Rollouts, probe: Probe, config: AttributionConfig) -> Credit:
    """Needs: the group's candidate answers and the template. Cost: (units + 1) x candidates forwards
    per trace (unit=token is the paper's; unit=segment is far cheaper)."""
    segment_ids, pl = players(rollouts, probe, config)
    candidates = candidate_answers(rollouts, probe.task, include_gold=True)
    jobs, plan = [], []
    for row in range(rollouts.batch_size):
        answers = [a for a, _ in candidates.get(int(rollouts.group[row]), [])]
        if len(answers) < 2 or not pl.spans[row]:
            continue
        conts = [probe.policy.encode_continuation("".join(probe.task.answer_probe(a)), eos=True) for a in answers]
        end = pl.spans[row][-1][1]
        units = [(t, t + 1) for t in range(end)] if config.unit == "token" else list(pl.spans[row])
        for unit_index, unit in enumerate([None] + units):
            removed = pl.tokens[row] if unit is None else pl.tokens[row][:unit[0]] + pl.tokens[row][unit[1]:]
            for c in conts:
                jobs.append((row, removed, c))
            plan.append((row, unit, len(conts)))
    values = score_contexts(rollouts, probe, jobs, config.batch_size)
    a_grpo = grpo_advantages(rollouts.rewards, rollouts.group)
    mask = rollouts.trainable_mask()
    weights = mask.float().clone()
    cursor, base = 0, {}
    importance: dict[int, list[tuple[tuple[int, int], float]]] = {}
    for row, unit, n in plan:
        logp = torch.log_softmax(values[cursor:cursor + n], 0)
        cursor += n
        if unit is None:
            base[row] = logp
        else:
            kl = float((base[row].exp() * (base[row] - logp)).sum())
            importance.setdefault(row, []).append((unit, kl))
    for row, items in importance.items():
        top = max(kl for _, kl in items)
        for (a, b), kl in items:
            weights[row, a:b] = oar_weights(torch.tensor(kl / top if top > 0 else 0.0))
        real = mask[row].float()
        weights[row] = mean_one(weights[row], real, flat_at=None)  # mass preserved: mean 1 over the row's tokens
    advantages = a_grpo[:, None] * weights * mask
    return Credit(advantages=advantages)
