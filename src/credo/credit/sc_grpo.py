"""SC-GRPO: self-conditioned token weights from the policy's own verified solutions.

Teacher = the same weights, no gradient, with a verified solution tau of the same prompt placed
before it (where it goes is the task's business: before the prompt for the tiny model, in the
system prompt for chat models). Per completion token:
  D_t = KL( pi(. | tau, x, o_<t) || pi(. | x, o_<t) )   full vocabulary, fp32, in row chunks
  f_t = D_t / (D_t + c),  c = max(quantile_q of D over the batch's active tokens, c_min)
Routing by n_c, the number of correct rollouts in a group of G:
  2 <= n_c < G  GRPO advantages with token weights f; each rollout is conditioned on a random
                correct tau other than itself;
  n_c = 0       a random rollout o_r is the reference; s_i = mean_{t <= min(|o_i|, |o_r|)} f_t;
                z-scored s is a diversity pseudo-advantage scaled by alpha (weights 1);
  n_c in {1, G} plain GRPO (n_c = 1 would collapse entropy onto a single solution).
Cost: a teacher and a student pass over every routed rollout (tokens scored, no generation).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from credo.config import check
from credo.credit.outcome import broadcast, grpo_advantages
from credo.credit.registry import register
from credo.probe import Probe
from credo.rollouts import Credit, Rollouts


@dataclass(frozen=True)
class SCGRPOConfig:
    """quantile: which quantile of D sets c (0.75). c_min: floor of c. alpha: scale of the n_c = 0
    pseudo-advantage. chunk_rows: rows per teacher/student pass (bounds memory for big vocabularies).
    seed: choice of references."""

    quantile: float = 0.75
    c_min: float = 1e-4
    alpha: float = 0.1
    chunk_rows: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        check(0 < self.quantile < 1, f"credit.quantile must be in (0, 1), got {self.quantile}")
        check(self.c_min > 0, f"credit.c_min must be > 0, got {self.c_min}")
        check(self.alpha >= 0, f"credit.alpha must be >= 0, got {self.alpha}")
        check(self.chunk_rows > 0, f"credit.chunk_rows must be > 0, got {self.chunk_rows}")


def self_conditioned_kl(rollouts: Rollouts, probe: Probe, rows: list[int], references: list[int],
                        chunk_rows: int) -> torch.Tensor:
    """D[len(rows), T]: KL(teacher || student) per completion token of `rows`, the teacher seeing the
    completion of row references[j] as its reference solution. Zero on padding."""
    task, policy = probe.task, probe.policy
    T = rollouts.completion_ids.shape[1]
    out = torch.zeros(len(rows), T)
    for start in range(0, len(rows), chunk_rows):
        chunk, refs = rows[start:start + chunk_rows], references[start:start + chunk_rows]
        comp_ids, comp_mask = rollouts.completion_ids[chunk], rollouts.completion_mask[chunk]
        teacher_prompts = [task.reference_prompt(rollouts.problems[i], rollouts.completions[r]) for i, r in zip(chunk, refs)]
        t_ids, t_mask = policy.encode_prompts(teacher_prompts)
        teacher = probe.completion_logits(t_ids, t_mask, comp_ids, comp_mask).float()
        student = probe.completion_logits(rollouts.prompt_ids[chunk], rollouts.prompt_mask[chunk], comp_ids, comp_mask).float()
        log_t, log_s = F.log_softmax(teacher, -1), F.log_softmax(student, -1)
        kl = (log_t.exp() * (log_t - log_s)).sum(-1).clamp(min=0)
        out[start:start + len(chunk)] = kl * comp_mask
    return out


def weight_from_divergence(D: torch.Tensor, mask: torch.Tensor, quantile: float, c_min: float,
                           gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """f = D / (D + c), c = max(quantile of D over active tokens, c_min); in [0, 1), 0 on padding.
    `gather` (Probe.gather) takes the quantile over the whole batch when it is split into shards."""
    active = D[mask]
    active = gather(active) if gather is not None else active
    c = max(float(torch.quantile(active, quantile)) if active.numel() else 0.0, c_min)
    return D / (D + c) * mask


@register("sc_grpo", "SC-GRPO: GRPO with token weights f = D/(D+c), D = KL(policy conditioned on its own verified solution || policy)",
          SCGRPOConfig, uses_model=True)
def sc_grpo(rollouts: Rollouts, probe: Probe, config: SCGRPOConfig) -> Credit:
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(rollouts.group.tolist()):
        groups.setdefault(g, []).append(row)
    correct = rollouts.correct.tolist()
    weighted_rows, weighted_refs, diversity = [], [], []
    for g, members in groups.items():
        # one generator per group id: the choices do not depend on which other groups share the batch (shards)
        rng = random.Random(config.seed * 1_000_003 + g)
        good = [i for i in members if correct[i]]
        if 2 <= len(good) < len(members):
            for i in members:
                weighted_rows.append(i)
                weighted_refs.append(rng.choice([j for j in good if j != i]))
        elif not good and len(members) > 1:
            diversity.append((members, rng.choice(members)))
    mask = rollouts.trainable_mask()
    a_grpo = grpo_advantages(rollouts.rewards, rollouts.group)
    advantages = broadcast(a_grpo, rollouts)
    weights = mask.float().clone()
    div_rows = [i for members, _ in diversity for i in members]
    div_refs = [r for members, r in diversity for _ in members]
    all_rows, all_refs = weighted_rows + div_rows, weighted_refs + div_refs
    info = {"weighted_rows": float(len(weighted_rows)), "diversity_rows": float(len(div_rows))}
    if not all_rows:
        probe.gather(torch.zeros(0))  # a collective: shards with routed rows are gathering their D
        return Credit(advantages=advantages, weights=weights, info=info)
    D = self_conditioned_kl(rollouts, probe, all_rows, all_refs, config.chunk_rows)
    f = weight_from_divergence(D, rollouts.completion_mask[all_rows], config.quantile, config.c_min, probe.gather)
    n_w = len(weighted_rows)
    if n_w:
        weights[weighted_rows] = f[:n_w] * mask[weighted_rows]
        info["f_mean"] = float(f[:n_w][mask[weighted_rows]].mean())
    cursor = n_w
    lengths = rollouts.completion_mask.sum(1)
    for members, ref in diversity:
        block = f[cursor:cursor + len(members)]
        cursor += len(members)
        s = torch.stack([block[j, :int(min(lengths[i], lengths[ref]))].mean() if min(lengths[i], lengths[ref]) > 0
                         else torch.tensor(0.0) for j, i in enumerate(members)])
        z = (s - s.mean()) / s.std() if float(s.std()) > 1e-8 else torch.zeros_like(s)
        for j, i in enumerate(members):
            advantages[i] = config.alpha * z[j] * mask[i]
    return Credit(advantages=advantages * mask, weights=weights, info=info)
