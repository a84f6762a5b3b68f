"""Value probes: the policy's own estimate of V(s_k) at every segment boundary.

Shared by RREDCoT (its redistribution), VinePPO / SPO-chain (MC), the SRPO `value` localiser and the
audit; no estimator or strategy reaches into another estimator's internals for them. Specification:
docs/methods.md, "## RREDCoT" (suffix and forced-answer values) and "## VinePPO and SPO-chain" (MC values).

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
MC values (`mc_values`, VinePPO) need no candidates: V(s_j) is the mean verified reward of k
continuations sampled from s_j (the expensive ground truth the audit compares against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from tqdm import tqdm

from credo.core.groups import group_rows
from credo.core.protocols import Policy, Samples, Task, left_pad, rewards_for
from credo.core.probe import Probe, prompt_tokens
from credo.core.rollouts import Rollouts
from credo.core.segment import segment_bounds

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


def step_differences(values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per row, V(s_0..s_K)[K + 1] -> the segment credit V(s_k) - V(s_{k-1}), k = 1..K [K]; it sums to
    r - V(s_0) (telescoping)."""
    return [v[1:] - v[:-1] for v in values]


def score_values(rollouts: Rollouts, probe: Probe, cuts: list[list[int]], candidates: list[list[list[Candidate]]],
                 mode: str, reuse_prefix: bool = True) -> list[torch.Tensor]:
    """Per row, V(s_0..s_K) from the candidates of each state (`candidates[row][j]`); V(s_K) = r.

    Identical (group, prefix, candidate) triples are scored once; rows are scored ROWS_PER_CALL at a
    time so the packed tree-attention mask stays small."""
    group = rollouts.group.tolist()
    slots: dict[tuple, int] = {}
    branches: list[tuple[int, int, tuple[int, ...]]] = []
    lookup: list[list[list[int]]] = []
    kept: list[list[list[Candidate]]] = []  # per row and state, the candidates scored (all, or those with utility)
    for row, row_cuts in enumerate(cuts):
        completion = rollouts.completion_ids[row].tolist()
        per_state = []
        kept.append([])
        for j, cut in enumerate(row_cuts):
            keep = [c for c in candidates[row][j] if mode == "normalized" or c.utility > 0]
            kept[row].append(keep)
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
        for j, keep in enumerate(kept[row]):
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
    members = group_rows(rollouts.group)
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


@dataclass
class Continuations:
    """Sampled continuations of N prefixes: tokens[i] = prefix + continuation (EOS kept when emitted),
    texts[i] its decoded text, rewards[N] / correct[N] the task's verdicts on the texts."""

    tokens: list[list[int]]
    texts: list[str]
    rewards: torch.Tensor
    correct: torch.Tensor


def continue_and_verify(sample: Callable[[torch.Tensor, torch.Tensor], Samples], policy: Policy, task: Task,
                        problems: Sequence[Any], prompts: Sequence[list[int]], prefixes: Sequence[list[int]],
                        device: torch.device | str = "cpu") -> Continuations:
    """One continuation per (prompt ids, completion-prefix ids) by `sample(ids[N, P], mask[N, P])` (a Probe's
    counted `sample`, or the policy's own with a generator): left-pad, sample, decode prefix + continuation
    as one text, verify it against `problems[i]`. The one "prefix -> sample -> verify" path of MC values,
    IBPO repairs and reset rollouts."""
    ids, mask = left_pad([list(p) + list(x) for p, x in zip(prompts, prefixes)], policy.pad_id, device)
    out = sample(ids, mask)
    tokens = [list(x) + c[m].tolist() for x, c, m in zip(prefixes, out.completion_ids, out.completion_mask)]
    texts = [policy.decode(torch.tensor(t, dtype=torch.long)) for t in tokens]
    rewards, correct = rewards_for(task, problems, texts)
    return Continuations(tokens, texts, rewards, correct)


@dataclass
class MCValues:
    """values[i]: V(s_0..s_{K_i}) of row i (the last entry is r_i); samples[i]: [K_i, k] rewards of the
    sampled continuations from s_0..s_{K_i - 1} (NaN rows for terminal prefixes)."""

    values: list[torch.Tensor]
    samples: list[torch.Tensor]

    def differences(self) -> list[torch.Tensor]:
        """Per row, the segment advantages V(s_k) - V(s_{k-1}), k = 1..K_i."""
        return step_differences(self.values)


def mc_values(probe: Probe, rollouts: Rollouts, segment_ids: torch.Tensor, k: int, batch_size: int = 1024,
              progress: bool = False) -> MCValues:
    """Monte Carlo values (VinePPO): V(s_j) = mean reward of `k` continuations sampled from s_j, at every
    segment boundary of every row; a prefix that already states a final answer is terminal (its value
    is its own reward, unsampled). Continuations of all prefixes are sampled `batch_size` at a time."""
    task, policy = probe.task, probe.policy
    bounds = segment_bounds(segment_ids)
    jobs: list[tuple[int, int, list[int]]] = []  # (row, state index j, prefix ids)
    terminal: dict[tuple[int, int], float] = {}
    for row, cuts in enumerate(state_cuts(segment_ids)):
        completion = rollouts.completion_ids[row].tolist()
        for j, cut in enumerate(cuts):
            text = policy.decode(torch.tensor(completion[:cut], dtype=torch.long))
            if j > 0 and task.extract_answer(text) is not None:
                terminal[(row, j)] = task.reward(rollouts.problems[row], text)
                continue
            jobs.append((row, j, completion[:cut]))
    repeated = [job for job in jobs for _ in range(k)]
    rewards = torch.zeros(len(repeated))
    for start in tqdm(range(0, len(repeated), batch_size), desc=f"MC continuations (k={k})", disable=not progress,
                      unit="batch", dynamic_ncols=True):
        chunk = repeated[start:start + batch_size]
        rewards[start:start + len(chunk)] = continue_and_verify(
            probe.sample, policy, task, [rollouts.problems[row] for row, _, _ in chunk],
            [prompt_tokens(rollouts.prompt_ids, rollouts.prompt_mask, row) for row, _, _ in chunk],
            [prefix for _, _, prefix in chunk], rollouts.prompt_ids.device).rewards
    per_job = rewards.view(len(jobs), k) if jobs else torch.zeros(0, k)
    samples = [torch.full((len(segs), k), float("nan")) for segs in bounds]
    for index, (row, j, _) in enumerate(jobs):
        samples[row][j] = per_job[index]
    values = []
    for row, segs in enumerate(bounds):
        v = torch.zeros(len(segs) + 1)
        for j in range(len(segs)):
            v[j] = terminal[(row, j)] if (row, j) in terminal else samples[row][j].mean()
        v[len(segs)] = rollouts.rewards[row]
        values.append(v)
    return MCValues(values, samples)
