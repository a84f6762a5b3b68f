"""SC-GRPO: self-conditioned token weights from the policy's own verified solutions.

Teacher = the same weights, no gradient, with a verified solution tau of the same prompt placed
before it (where it goes is the task's business: before the prompt for the tiny model, in the
system prompt for chat models). Per completion token:
  D_t = KL( pi(. | tau, x, o_<t) || pi(. | x, o_<t) )   full vocabulary, fp32, in row chunks
  f_t = D_t / (D_t + c),  c = max(quantile_q of D over the batch's active tokens, c_min)
Routing by n_c, the number of correct rollouts in a group of G:
  2 <= n_c < G  GRPO advantages with token weights f (renormalised to mean 1 over each sequence's
                tokens when `normalise`, the default: f has mean ~0.19 on the shipped start, and raw
                f would shrink these groups' share of the gradient from ~87% to ~45% in favour of
                n_c = 1 groups); each rollout is conditioned on a random correct tau other than itself;
  n_c = 0       a random rollout o_r is the reference; for the others s_i = mean_{t <= min(|o_i|,
                |o_r|)} f_t (raw f), z-scored among the others (o_r, conditioned on itself, stays out
                and gets 0) into a diversity pseudo-advantage scaled by alpha (weights 1);
  n_c in {1, G} plain GRPO (n_c = 1 would collapse entropy onto a single solution); with
                `single_correct` (ours, off by default) an n_c = 1 group's wrong members are weighted with
                the lone correct rollout as their tau, the correct one keeping weight 1.
References are drawn from per-step, per-group RNGs: seeded by a draw from the run's probe generator
(seeded by the run seed, saved in checkpoints; the same on every data-parallel shard), `seed` and
the group id, so steps differ, runs repeat, and shards choose as the whole batch would.
A teacher context longer than the model's context (tau + prompt + completion; a trace longer than
half the context) keeps the head of tau and drops the rest of it (`teacher_truncated_rows` counts them).
Cost: a teacher and a student pass over every routed rollout (tokens scored, no generation).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from credo.core.config import check
from credo.core.groups import broadcast, group_rows, grpo_advantages, mean_one, zscore
from credo.credit.registry import register
from credo.core.probe import Probe
from credo.core.rollouts import Credit, Rollouts


@dataclass(frozen=True)
class SCGRPOConfig:
    """SC-GRPO's self-conditioned token weights (module docstring)."""

    quantile: float = 0.75
    """Which quantile of D over the batch's active tokens sets c in f = D / (D + c), in (0, 1)."""
    c_min: float = 1e-4
    """Floor of c (> 0), so a batch of near-zero divergences does not blow the weights up."""
    alpha: float = 0.1
    """Scale (>= 0) of the diversity pseudo-advantage of the groups with no correct rollout (0: they get none)."""
    normalise: bool = True
    """Rescale f to mean 1 over each weighted sequence's tokens (false: the paper's raw f in [0, 1))."""
    chunk_rows: int = 64
    """Rows per teacher/student pass (bounds the memory of the full-vocabulary distributions, not results)."""
    seed: int = 0
    """Offset of the per-step, per-group RNG that draws the reference solutions (combined with a draw from the
    run's probe generator)."""
    single_correct: bool = False
    """(ours) In a group with exactly one correct rollout, weight its wrong members with that lone verified
    solution as their teacher's tau (the correct one keeps weight 1: it has no tau but itself); false: the
    paper's plain GRPO for such groups."""

    def __post_init__(self) -> None:
        check(0 < self.quantile < 1, f"credit.quantile must be in (0, 1), got {self.quantile}")
        check(self.c_min > 0, f"credit.c_min must be > 0, got {self.c_min}")
        check(self.alpha >= 0, f"credit.alpha must be >= 0, got {self.alpha}")
        check(self.chunk_rows > 0, f"credit.chunk_rows must be > 0, got {self.chunk_rows}")


def self_conditioned_kl(rollouts: Rollouts, probe: Probe, rows: list[int], references: list[int],
                        chunk_rows: int, truncated: list[int] | None = None) -> torch.Tensor:
    """D[len(rows), T]: KL(teacher || student) per completion token of `rows`, the teacher seeing the
    completion of row references[j] as its reference solution (its head only, where the whole would
    not fit the context; such rows are appended to `truncated`). Zero on padding."""
    task, policy = probe.task, probe.policy
    T = rollouts.completion_ids.shape[1]
    out = torch.zeros(len(rows), T, device=rollouts.completion_ids.device)
    for start in range(0, len(rows), chunk_rows):
        chunk, refs = rows[start:start + chunk_rows], references[start:start + chunk_rows]
        comp_ids, comp_mask = rollouts.completion_ids[chunk], rollouts.completion_mask[chunk]
        teacher_prompts = [teacher_prompt(task, policy, rollouts.problems[i], rollouts.completions[r], T,
                                          truncated, i) for i, r in zip(chunk, refs)]
        t_ids, t_mask = policy.encode_prompts(teacher_prompts)
        teacher = probe.completion_logits(t_ids, t_mask, comp_ids, comp_mask).float()
        student = probe.completion_logits(rollouts.prompt_ids[chunk], rollouts.prompt_mask[chunk],
                                          comp_ids, comp_mask).float()
        log_t, log_s = F.log_softmax(teacher, -1), F.log_softmax(student, -1)
        kl = (log_t.exp() * (log_t - log_s)).sum(-1).clamp(min=0)
        out[start:start + len(chunk)] = kl * comp_mask
    return out


def context_length(policy) -> int | None:  # noqa: ANN001
    """The most positions the policy's model can read (None when it does not say)."""
    config = getattr(policy.model, "config", None)
    for name in ("max_len", "max_position_embeddings"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return None


def teacher_prompt(task, policy, problem, reference: str, completion_width: int, truncated: list[int] | None,
                   row: int) -> str:  # noqa: ANN001
    """The task's teacher context for `problem` with `reference` as tau; when it and a completion of
    `completion_width` tokens would exceed the context, tau is cut to the longest head that fits."""
    text = task.reference_prompt(problem, reference)
    limit = context_length(policy)
    if limit is None or _prompt_length(policy, text) + completion_width <= limit:
        return text
    ids = policy.encode_continuation(reference)
    keep = max(limit - completion_width - _prompt_length(policy, task.reference_prompt(problem, "")), 0)
    while True:  # re-encoding a cut text can change its length by a token: shrink until it fits
        text = task.reference_prompt(problem, policy.decode(torch.tensor(ids[:keep], dtype=torch.long)))
        if _prompt_length(policy, text) + completion_width <= limit:
            break
        if keep == 0:  # not even an empty tau fits: no teacher signal for this row (D = 0)
            text = problem.prompt
            break
        keep -= 1
    if truncated is not None:
        truncated.append(row)
    return text


def _prompt_length(policy, text: str) -> int:  # noqa: ANN001
    return int(policy.encode_prompts([text])[1].sum())


def weight_from_divergence(D: torch.Tensor, mask: torch.Tensor, quantile: float, c_min: float,
                           gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """f = D / (D + c), c = max(quantile of D over active tokens, c_min); in [0, 1), 0 on padding.
    `gather` (Probe.gather) takes the quantile over the whole batch when it is split into shards."""
    active = D[mask]
    active = gather(active) if gather is not None else active
    c = max(float(torch.quantile(active, quantile)) if active.numel() else 0.0, c_min)
    return D / (D + c) * mask


def weighted_group_rows(rollouts: Rollouts, single_correct: bool = False) -> list[int]:
    """The rows SC-GRPO gives token weights (route's weighted rows, which need no draw to find): every member
    of a group with 2 <= n_c < G, and with single_correct the wrong members of a group with n_c = 1. The
    other rows get plain GRPO or the diversity term, uniform within the row, so an audit of their credit
    locates nothing by design."""
    groups = group_rows(rollouts.group)
    correct = rollouts.correct.tolist()
    rows = []
    for members in groups.values():
        good = [i for i in members if correct[i]]
        if 2 <= len(good) < len(members):
            rows += members
        elif single_correct and len(good) == 1 and len(members) > 1:
            rows += [i for i in members if i != good[0]]
    return sorted(rows)


def route(rollouts: Rollouts, seed: str,
          single_correct: bool = False) -> tuple[list[int], list[int], list[tuple[list[int], int]]]:
    """(weighted rows, their reference rows, n_c = 0 groups as (members but the reference, reference)).
    One generator per group id, seeded by `seed` and the id, so the choices do not depend on which
    other groups share the batch (data-parallel shards). single_correct: SCGRPOConfig.single_correct."""
    groups = group_rows(rollouts.group)
    correct = rollouts.correct.tolist()
    weighted_rows, weighted_refs, diversity = [], [], []
    for g, members in groups.items():
        rng = random.Random(f"{seed}:{g}")
        good = [i for i in members if correct[i]]
        if 2 <= len(good) < len(members):
            for i in members:
                weighted_rows.append(i)
                weighted_refs.append(rng.choice([j for j in good if j != i]))
        elif single_correct and len(good) == 1 and len(members) > 1:
            for i in members:
                if i != good[0]:
                    weighted_rows.append(i)
                    weighted_refs.append(good[0])
        elif not good and len(members) > 1:
            ref = rng.choice(members)
            diversity.append(([i for i in members if i != ref], ref))
    return weighted_rows, weighted_refs, diversity


@register("sc_grpo",
          "SC-GRPO: GRPO with token weights f = D/(D+c), D = KL(policy conditioned on its own "
          "verified solution || policy)",
          SCGRPOConfig, uses_model=True)
def sc_grpo(rollouts: Rollouts, probe: Probe, config: SCGRPOConfig) -> Credit:
    step_seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=probe.generator))  # the same on every shard
    weighted_rows, weighted_refs, diversity = route(rollouts, f"{step_seed}:{config.seed}", config.single_correct)
    mask = rollouts.trainable_mask()
    a_grpo = grpo_advantages(rollouts.rewards, rollouts.group)
    advantages = broadcast(a_grpo, rollouts)
    weights = mask.float().clone()
    div_rows = [i for others, _ in diversity for i in others]
    div_refs = [r for others, r in diversity for _ in others]
    all_rows, all_refs = weighted_rows + div_rows, weighted_refs + div_refs
    info = {"weighted_rows": float(len(weighted_rows)), "diversity_rows": float(len(div_rows))}
    if not all_rows:
        probe.gather(torch.zeros(0))  # a collective: shards with routed rows are gathering their D
        return Credit(advantages=advantages, weights=weights, info=info)
    truncated: list[int] = []
    D = self_conditioned_kl(rollouts, probe, all_rows, all_refs, config.chunk_rows, truncated)
    info["teacher_truncated_rows"] = float(len(truncated))
    f = weight_from_divergence(D, rollouts.completion_mask[all_rows], config.quantile, config.c_min, probe.gather)
    n_w = len(weighted_rows)
    if n_w:
        w = f[:n_w] * mask[weighted_rows]
        info["f_mean"] = float(w[mask[weighted_rows]].mean())
        # a row of zeros becomes all ones (no token stands out)
        weights[weighted_rows] = mean_one(w, mask[weighted_rows], floor=1e-12, flat_at=1e-12) if config.normalise else w
    _diversity_advantages(advantages, f[n_w:], diversity, rollouts.completion_mask.sum(1), mask, config.alpha)
    return Credit(advantages=advantages * mask, weights=weights, info=info)


def _diversity_advantages(advantages: torch.Tensor, f: torch.Tensor, diversity: list[tuple[list[int], int]],
                          lengths: torch.Tensor, mask: torch.Tensor, alpha: float) -> None:
    """n_c = 0 groups, in place: alpha * z(s) for the members other than the reference (z over them
    only; 0 when their scores differ by less than 1e-6), 0 for the reference. f[rows, T]: raw weights of
    those members, in `diversity` order."""
    cursor = 0
    for others, ref in diversity:
        block = f[cursor:cursor + len(others)]
        cursor += len(others)
        s = torch.stack([block[j, :int(min(lengths[i], lengths[ref]))].mean() if min(lengths[i], lengths[ref]) > 0
                         else torch.tensor(0.0, device=block.device) for j, i in enumerate(others)])
        s = s.double()  # scores equal up to float32 noise must give z = 0, not a noise-sized z of +-0.8
        spread = float(s.max() - s.min()) if len(others) > 1 else 0.0
        z = zscore(s).float() if spread > 1e-6 else torch.zeros(len(others))
        for j, i in enumerate(others):
            advantages[i] = alpha * z[j] * mask[i]
        advantages[ref] = 0.0
