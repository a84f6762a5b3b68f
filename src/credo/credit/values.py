"""Value probes: the policy's own estimate of V(s_k) at every segment boundary, with no generation.

Shared by RREDCoT (its redistribution), the SRPO `value` localiser and the audit; no estimator
reaches into another's internals for them. Specification: docs/methods.md, "## RREDCoT".

State j of row i is s_j = prompt + the row's first j segments (j = 0..K_i - 1); every value list
returned here is V(s_0..s_{K_i}) with the last entry V(s_{K_i}) := r_i, the observed outcome.
A value is an importance-sampling estimate over a set of candidate continuations c of s_j, each
teacher-forced after s_j (the prefix KV cache is reused, see `Policy.score_branches`) and each with
a utility u(c) in [0, 1]: a member's tail carries that member's reward r_m (which, for rewards
that depend on the final answer, is the reward of s_j + tail), the reference tail its verified reward:
  absolute    V = sum_c u(c) pi(c | s_j)                 (a lower bound in expectation; only
                                                          candidates with u > 0 are scored)
  normalized  V = sum_c u(c) pi(c | s_j) / sum_c pi(c | s_j)
Candidates:
  suffixes  the group's own tails after their own j-th segment (distinct tails only; the row's own
            tail included), plus the task's reference-solution tail after its j-th step when the
            task has one (`task.reference_solution`) and `include_reference` is set;
  answers   the forced-answer probe: the task's answer template T, then each distinct final answer
            of the group (plus the gold answer with `include_gold`); pi(a | s_j + T) in both modes:
            the template is conditioned on, never counted (it is a marker the policy never samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from credo.probe import Probe
from credo.rollouts import Rollouts
from credo.segment import segment_bounds

VALUE_MODES = ("normalized", "absolute")
ROWS_PER_CALL = 16  # rows scored per packed branch pass: bounds the tree-attention mask's memory


@dataclass(frozen=True)
class Candidate:
    """A continuation teacher-forced after a state: `tokens`, of which `tokens[offset:]` are counted
    (the rest is a conditioning template), with utility `utility` in [0, 1]."""

    tokens: tuple[int, ...]
    utility: float
    offset: int = 0


def state_cuts(segment_ids: torch.Tensor) -> list[list[int]]:
    """segment_ids[B, T] -> per row, the completion length of each state s_0..s_{K-1}."""
    return [[0] + [end for _, end in segs[:-1]] if segs else [] for segs in segment_bounds(segment_ids)]


def group_rows(rollouts: Rollouts) -> dict[int, list[int]]:
    """Group id -> its rows, in batch order."""
    out: dict[int, list[int]] = {}
    for row, g in enumerate(rollouts.group.tolist()):
        out.setdefault(g, []).append(row)
    return out


def score_values(rollouts: Rollouts, probe: Probe, cuts: list[list[int]], candidates: list[list[list[Candidate]]],
                 mode: str, reuse_prefix: bool = True) -> list[torch.Tensor]:
    """Per row, V(s_0..s_K) from the candidates of each state (`candidates[row][j]`); V(s_K) = r.

    Identical (group, prefix, candidate) triples are scored once; rows are scored ROWS_PER_CALL at a
    time so the packed tree-attention mask stays small."""
    group = rollouts.group.tolist()
    slots: dict[tuple, int] = {}
    branches: list[tuple[int, int, tuple[int, ...]]] = []
    lookup: list[list[list[int]]] = []
    for row, row_cuts in enumerate(cuts):
        completion = rollouts.completion_ids[row].tolist()
        per_state = []
        for j, cut in enumerate(row_cuts):
            keep = [c for c in candidates[row][j] if mode == "normalized" or c.utility > 0]
            index = []
            for c in keep:
                key = (group[row], tuple(completion[:cut]), c.tokens)
                if key not in slots:
                    slots[key] = len(branches)
                    branches.append((row, cut, c.tokens))
                index.append(slots[key])
            per_state.append(index)
        lookup.append(per_state)
    scored = _score_in_chunks(rollouts, probe, branches, reuse_prefix)
    values = []
    for row, row_cuts in enumerate(cuts):
        v = torch.zeros(len(row_cuts) + 1)
        for j in range(len(row_cuts)):
            keep = [c for c in candidates[row][j] if mode == "normalized" or c.utility > 0]
            logp = [float(scored[b][c.offset:].sum()) for b, c in zip(lookup[row][j], keep)]
            v[j] = combine(torch.tensor(logp), torch.tensor([c.utility for c in keep]), mode)
        v[len(row_cuts)] = rollouts.rewards[row]
        values.append(v)
    return values


def combine(logprobs: torch.Tensor, utilities: torch.Tensor, mode: str) -> float:
    """logprobs[C] and utilities[C] of a state's candidates -> its value (0 when nothing has utility)."""
    if logprobs.numel() == 0 or not bool((utilities > 0).any()):
        return 0.0
    good = utilities > 0
    weighted = torch.logsumexp(logprobs[good] + utilities[good].log(), 0)
    if mode == "absolute":
        return float(weighted.exp().clamp(max=1.0))
    return float((weighted - torch.logsumexp(logprobs, 0)).exp().clamp(max=1.0))


def _score_in_chunks(rollouts: Rollouts, probe: Probe, branches: list[tuple[int, int, tuple[int, ...]]],
                     reuse_prefix: bool) -> list[torch.Tensor]:
    order = sorted(range(len(branches)), key=lambda b: branches[b][0])
    out: list[torch.Tensor] = [torch.zeros(0)] * len(branches)
    start = 0
    while start < len(order):
        first_row = branches[order[start]][0]
        stop = start
        while stop < len(order) and branches[order[stop]][0] < first_row + ROWS_PER_CALL:
            stop += 1
        part = order[start:stop]
        for b, lp in zip(part, probe.score_branches(rollouts, [branches[b] for b in part], reuse_prefix)):
            out[b] = lp
        start = stop
    return out


def reference_tails(probe: Probe, problem: Any, states: int) -> tuple[list[tuple[int, ...] | None], float]:
    """(token ids of the task's reference solution after its j-th step, j = 0..states-1, EOS-terminated;
    None where the task has no reference solution or it has no j-th step), and the reference's
    reward by the task's verifier (its utility)."""
    hook = getattr(probe.task, "reference_solution", None)
    steps = hook(problem) if hook is not None else None
    if not steps:
        return [None] * states, 0.0
    tails = [tuple(probe.policy.encode_continuation("".join(steps[j:]), eos=True)) if j < len(steps) else None
             for j in range(states)]
    return tails, float(probe.task.reward(problem, "".join(steps)))


def suffix_candidates(rollouts: Rollouts, probe: Probe, segment_ids: torch.Tensor,
                      include_reference: bool) -> list[list[list[Candidate]]]:
    """candidates[row][j]: the group's distinct tails after their own j-th segment, each with its
    member's reward as utility, plus the reference tail with the reference's verified reward."""
    bounds = segment_bounds(segment_ids)
    lengths = rollouts.lengths.tolist()
    rewards = rollouts.rewards.tolist()
    members = group_rows(rollouts)
    out = []
    for row, cuts in enumerate(state_cuts(segment_ids)):
        references, reference_reward = ([None] * len(cuts), 0.0)
        if include_reference:
            references, reference_reward = reference_tails(probe, rollouts.problems[row], len(cuts))
        per_state = []
        for j in range(len(cuts)):
            tails = {tuple(rollouts.completion_ids[m, bounds[m][j][0]:lengths[m]].tolist()): rewards[m]
                     for m in members[int(rollouts.group[row])] if len(bounds[m]) > j}
            if references[j] is not None:
                tails[references[j]] = max(reference_reward, tails.get(references[j], 0.0))
            per_state.append([Candidate(t, u) for t, u in sorted(tails.items()) if t])
        out.append(per_state)
    return out


def suffix_values(rollouts: Rollouts, probe: Probe, segment_ids: torch.Tensor, mode: str = "absolute",
                  include_reference: bool = True, reuse_prefix: bool = True) -> list[torch.Tensor]:
    """Per row, V(s_0..s_K) over the group's own tails (+ the reference tail); see the module docstring."""
    candidates = suffix_candidates(rollouts, probe, segment_ids, include_reference)
    return score_values(rollouts, probe, state_cuts(segment_ids), candidates, mode, reuse_prefix)


def candidate_answers(rollouts: Rollouts, task: Any, include_gold: bool) -> dict[int, list[tuple[str, bool]]]:
    """Per group id: the distinct final answers of its members (+ gold), each with its verdict."""
    out: dict[int, list[tuple[str, bool]]] = {}
    for g, problem, text in zip(rollouts.group.tolist(), rollouts.problems, rollouts.completions):
        seen = out.setdefault(g, [])
        found = [task.extract_answer(text)]
        if include_gold and getattr(problem, "answer", None):
            found.append(problem.answer)
        for answer in found:
            if answer is not None and all(answer != a for a, _ in seen):
                seen.append((answer, bool(task.check_answer(problem, answer))))
    return out


def answer_values(rollouts: Rollouts, probe: Probe, segment_ids: torch.Tensor, mode: str = "normalized",
                  include_gold: bool = True, reuse_prefix: bool = True) -> list[torch.Tensor]:
    """Per row, V(s_0..s_K) from the forced-answer probe; see the module docstring."""
    task, policy = probe.task, probe.policy
    answers = candidate_answers(rollouts, task, include_gold)
    encoded: dict[str, Candidate] = {}
    cuts = state_cuts(segment_ids)
    candidates = []
    for row, row_cuts in enumerate(cuts):
        per_answer = []
        for answer, ok in answers.get(int(rollouts.group[row]), []):
            if answer not in encoded:
                template, text = task.answer_probe(answer)
                encoded[answer] = Candidate(tuple(policy.encode_continuation(template + text, eos=True)), 0.0,
                                            len(policy.encode_continuation(template, eos=False)))
            c = encoded[answer]
            per_answer.append(Candidate(c.tokens, float(ok), c.offset))
        candidates.append([per_answer] * len(row_cuts))
    return score_values(rollouts, probe, cuts, candidates, mode, reuse_prefix)
