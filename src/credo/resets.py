"""RRPO / SRPO reset rollouts: return to a state of a failed trace and resample what follows it.

Per prompt (defaults of the public SRPO code, n = 8):
  search   fresh completions are drawn one at a time (batched across prompts, same law): the FIRST
           failure becomes the parent (never trained on), the others fill Group 1 up to `n_fresh`;
           at most `max_fresh_attempts` fresh draws in all, Group 1 included. A completion with no
           steps (empty) goes to Group 1, never becomes a parent. Correct draws beyond a full Group 1
           are discarded (their tokens still count);
  Group 1  `n_fresh` fresh completions (trained on, whole completion; topped up if the search ran out);
  reset    step k of the parent chosen by a localiser (minus `backoff` steps, floored at 0);
  Group 2  `n_reset` continuations from prompt + the parent's steps < k; trained on the suffix only
           (the prefix is masked out of the loss).
The two groups get separate group ids, so advantages are normalised inside each. When no failure
is found, one plain group of n_fresh + n_reset fresh completions is used instead.

Localisers (which step is the first error?):
  random  uniform over the parent's steps (RRPO);
  value   the first step whose drop in the policy's own suffix value exceeds `value_drop` (SRPO,
          ours, for models that cannot follow instructions; see `localise_by_value`);
  prompt  SRPO as its public code does it (instruction models; needs a task with
          `localisation_prompt`): the early-biasing request as a bare user turn (no system prompt),
          sampled at `prompt_temperature` (0.3) with up to `prompt_max_new_tokens` reply tokens;
          parsed by `parse_step_index` (last boxed N, else last "Step N", else step 1);
  oracle  the task's labelled first wrong step (synthetic tasks only: the credit-assignment oracle);
  self    SRPO's self-localisation (the `srpo` recipe): `prompt` where the task has a localisation
          request (instruction models, as the paper), `value` otherwise (the tiny arith policy cannot
          follow instructions).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from credo.config import check
from credo.policy.base import Policy, SamplingConfig, left_pad, right_pad
from credo.probe import Probe, prompt_tokens
from credo.rollouts import Rollouts, concat_rollouts
from credo.segment import segment_bounds, segmenter_config
from credo.strategies import Collected, mixed_groups, sample_groups
from credo.tasks.base import Problem, Task, rewards_for

LOCALISERS = ("random", "value", "prompt", "oracle", "self")


@dataclass(frozen=True)
class ResetConfig:
    """n_fresh / n_reset: sizes of Group 1 and Group 2. max_fresh_attempts: fresh draws per prompt
    spent filling Group 1 and looking for a failed parent (Group 1 included, as the public code).
    localiser: random | value | prompt | oracle | self. backoff: reset this many steps earlier than
    localised. segmenter: what a step is. prompt_temperature / prompt_max_new_tokens: the prompt
    localiser's sampling temperature and reply budget (the public code: 0.3 and 4096 tokens; a
    budget that cuts the reasoning short leaves the reply unparsable, which falls back to step 1).
    value_drop: the value localiser's threshold on a step's value drop."""

    n_fresh: int = 4
    n_reset: int = 4
    max_fresh_attempts: int = 12
    localiser: str = "random"
    backoff: int = 0
    segmenter: Any = "lines"
    prompt_temperature: float = 0.3
    prompt_max_new_tokens: int = 4096
    value_drop: float = 0.05

    def __post_init__(self) -> None:
        check(self.n_fresh >= 2 and self.n_reset >= 2, f"reset.n_fresh and reset.n_reset must be >= 2, got {self.n_fresh}/{self.n_reset}")
        check(self.max_fresh_attempts >= 1, f"reset.max_fresh_attempts must be >= 1, got {self.max_fresh_attempts}")
        check(self.localiser in LOCALISERS, f"reset.localiser must be one of {LOCALISERS}, got {self.localiser!r}")
        check(self.backoff >= 0, f"reset.backoff must be >= 0, got {self.backoff}")
        check(self.prompt_temperature >= 0, f"reset.prompt_temperature must be >= 0, got {self.prompt_temperature}")
        check(self.prompt_max_new_tokens >= 1, f"reset.prompt_max_new_tokens must be >= 1, got {self.prompt_max_new_tokens}")
        check(0 < self.value_drop < 1, f"reset.value_drop must be in (0, 1), got {self.value_drop}")
        segmenter_config(self.segmenter)


def parse_step_index(reply: str, n_steps: int) -> int:
    """0-based step from a localisation reply, as the public SRPO parser reads it (1-based there):
    the last `\\boxed{N}` when N is an integer in 1..n_steps (0 means step 1); else the last
    "Step N" / "step N" of the prose when N is in 1..n_steps; else step 1. Empty, truncated and
    number-free replies therefore reset at step 1, the early-biased fallback."""
    return parse_step(reply, n_steps)[0]


def parse_step(reply: str, n_steps: int) -> tuple[int, str]:
    """(0-based step, the rule that decided it: 'boxed', 'prose' or 'fallback'); see parse_step_index."""
    n_steps = max(n_steps, 1)
    step = _boxed_step(reply, n_steps)
    if step is not None:
        return step - 1, "boxed"
    mentions = re.findall(r"[Ss]tep\s+(\d+)", reply)
    if mentions and 1 <= int(mentions[-1]) <= n_steps:
        return int(mentions[-1]) - 1, "prose"
    return 0, "fallback"


def _boxed_step(reply: str, n_steps: int) -> int | None:
    """The 1-based step in the last brace-balanced `\\boxed{...}`, or None when absent, unbalanced
    (a truncated reply), not an integer or out of range. `\\boxed{0}` ("no error") means step 1."""
    start = reply.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    while i < len(reply) and depth:
        depth += {"{": 1, "}": -1}.get(reply[i], 0)
        i += 1
    content = reply[start + len("\\boxed{"):i - 1].strip()
    if depth or not re.fullmatch(r"[+-]?\d+", content):
        return None
    value = int(content)
    return 1 if value == 0 else value if 1 <= value <= n_steps else None


def localise(name: str, rollouts: Rollouts, rows: Sequence[int], probe: Probe, segment_ids: torch.Tensor,
             rng: random.Random, prompt_temperature: float = 0.3, value_drop: float = 0.05, *,
             prompt_max_new_tokens: int = 4096) -> list[int]:
    """The 0-based step to reset at for each row in `rows` (each a failed trace)."""
    if name == "self":
        name = "prompt" if getattr(probe.task, "localisation_prompt", None) is not None else "value"
    n_steps = [len(b) for b in segment_bounds(segment_ids[list(rows)])]
    if name == "random":
        return [rng.randrange(max(n, 1)) for n in n_steps]
    if name == "oracle":
        if not getattr(probe.task, "has_step_labels", False):
            raise ValueError("the oracle localiser needs a task with step labels (e.g. arith)")
        out = []
        for row, n in zip(rows, n_steps):
            first = probe.task.step_truth(rollouts.problems[row], rollouts.completions[row]).first_error
            out.append(min(first if first is not None else n - 1, max(n - 1, 0)))
        return out
    if name == "value":
        return localise_by_value(rollouts, rows, probe, segment_ids, value_drop)
    if name == "prompt":
        replies = localisation_replies(rollouts, rows, probe, segment_ids, prompt_temperature, prompt_max_new_tokens)
        return [parse_step_index(reply, max(n, 1)) for reply, n in zip(replies, n_steps)]
    raise ValueError(f"unknown localiser {name!r}; available: {LOCALISERS}")


def localise_by_value(rollouts: Rollouts, rows: Sequence[int], probe: Probe, segment_ids: torch.Tensor,
                      threshold: float) -> list[int]:
    """SRPO's `value` localiser (ours; docs/methods.md, "## RRPO and SRPO"): the first step k whose
    drop V(s_k) - V(s_{k+1}) of the policy's own normalized suffix value exceeds `threshold`; the
    final transition V(s_{K-1}) -> r is excluded; step 1 (index 0) when no drop qualifies or the
    parent has no final answer.

    Each parent is valued alone, as at training time (there is no group then): its candidates are
    its own tail after each step (utility 0, it failed) and the task's reference-solution tail
    after the same step (utility by the verifier), so V(s_k) = pi(ref | s_k) / (pi(ref | s_k) +
    pi(own | s_k)). No gold answer is forced as a candidate; the reference tail, a worked solution,
    does end with the gold answer. A task without a reference solution gives V = 0 everywhere and so
    step 1 for every parent: use `prompt` or `random` there. The normalized value and the 0.05
    default were chosen on training problems (docs/results/audit-faithful/choose_value_drop.txt:
    top-1 0.957 with step-1 share 0.504 vs the oracle's 0.475; the absolute value reaches 0.763)."""
    from credo.credit.values import suffix_values
    index = list(rows)
    alone = rollouts.select(index).with_fields(group=torch.arange(len(index)))
    values = suffix_values(alone, probe, segment_ids[index], mode="normalized", include_reference=True)
    return [first_value_drop(v, threshold) if probe.task.extract_answer(text) is not None else 0
            for v, text in zip(values, alone.completions)]


def first_value_drop(values: torch.Tensor, threshold: float) -> int:
    """values[K + 1] = V(s_0..s_K) -> the first k in 0..K-2 with V(s_k) - V(s_{k+1}) > threshold
    (the final transition into the outcome is excluded), else 0."""
    drops = values[:-2] - values[1:-1]
    hits = (drops > threshold).nonzero().flatten().tolist()
    return hits[0] if hits else 0


def localisation_replies(rollouts: Rollouts, rows: Sequence[int], probe: Probe, segment_ids: torch.Tensor,
                         temperature: float, max_new_tokens: int) -> list[str]:
    """The policy's own replies to the task's localisation request for each row, sent as a bare user
    turn (no system prompt: the task's answer-format instruction would contradict "reply with the
    step number"), one batched sampling call. top_p is the run's, as in the public code."""
    builder = getattr(probe.task, "localisation_prompt", None)
    if builder is None:
        raise ValueError(f"the prompt localiser needs a task with localisation_prompt (chat models); "
                         f"task {getattr(probe.task, 'name', '?')!r} has none: use value, random or oracle")
    policy = probe.policy
    prompts = []
    for row in rows:
        steps = [policy.decode(rollouts.completion_ids[row, a:b]) for a, b in segment_bounds(segment_ids[[row]])[0]]
        prompts.append(builder(rollouts.problems[row], steps))
    ids, mask = policy.encode_prompts(prompts, system=False)
    out = probe.sample(ids, mask, SamplingConfig(temperature, probe.sampling.top_p, max_new_tokens))
    return [policy.decode(r) for r in out.completion_ids]


def continue_from(policy: Policy, task: Task, jobs: Sequence[tuple[Rollouts, int, int, int]], n: int,
                  sampling: SamplingConfig, generator: torch.Generator) -> Rollouts:
    """For each (base, row, cut, group_id) job, n continuations of the base row after its first `cut`
    completion tokens, as completions prefix + continuation with the prefix masked out of the loss;
    all jobs in one sampling call, rows in job order, each job's rows under its group_id."""
    device = jobs[0][0].prompt_ids.device
    prompts, prefixes, problems, groups = [], [], [], []
    for base, row, cut, group_id in jobs:
        prompt = prompt_tokens(base.prompt_ids, base.prompt_mask, row)
        prefix = base.completion_ids[row, :cut].tolist()
        prompts += [prompt] * n
        prefixes += [prefix] * n
        problems += [base.problems[row]] * n
        groups += [group_id] * n
    ids, mask = left_pad([p + x for p, x in zip(prompts, prefixes)], policy.pad_id, device)
    out = policy.sample(ids, mask, sampling, generator)
    completions = [x + c[m].tolist() for x, c, m in zip(prefixes, out.completion_ids, out.completion_mask)]
    comp_ids, comp_mask = right_pad(completions, policy.pad_id, device)
    texts = [policy.decode(torch.tensor(c, dtype=torch.long)) for c in completions]
    rewards, correct = rewards_for(task, problems, texts)
    p_ids, p_mask = left_pad(prompts, policy.pad_id, device)
    loss_mask = comp_mask.clone()
    for i, prefix in enumerate(prefixes):
        loss_mask[i, :len(prefix)] = False
    return Rollouts(p_ids, p_mask, comp_ids, comp_mask, torch.tensor(groups, dtype=torch.long), rewards,
                    torch.zeros(comp_ids.shape), correct, problems, texts, loss_mask=loss_mask)


@dataclass
class _Search:
    """One prompt's parent search: Group 1 rows so far, the parent (if found), fresh draws spent."""

    group1: list[tuple[Rollouts, int]]
    parent: tuple[Rollouts, int] | None = None
    draws: int = 0


def search_parents(policy: Policy, task: Task, problems: Sequence[Problem], config: ResetConfig,
                   sampling: SamplingConfig, generator: torch.Generator) -> tuple[list[_Search], int]:
    """The public SRPO search, per prompt: fresh completions in order; the first failure with at least
    one step is the parent, the rest fill Group 1 (extra correct ones are dropped); stop when Group 1
    is full and a parent is found, or after `max_fresh_attempts` draws. Each round draws, per prompt,
    the fewest completions the sequential search still needs for sure (Group 1's free slots, plus one
    while no parent is found), so batching across prompts draws exactly what one-at-a-time would.
    Returns the searches and the tokens generated."""
    searches = [_Search([]) for _ in problems]
    generated = 0
    while True:
        requests = []
        for p, s in enumerate(searches):
            need = (config.n_fresh - len(s.group1)) + (s.parent is None)
            if need > 0 and s.draws < config.max_fresh_attempts:
                requests += [p] * min(need, config.max_fresh_attempts - s.draws)
        if not requests:
            return searches, generated
        batch = sample_groups(policy, task, [problems[p] for p in requests], 1, sampling, generator)
        generated += int(batch.completion_mask.sum())
        for j, p in enumerate(requests):  # in draw order: the same outcome as drawing one at a time
            s = searches[p]
            s.draws += 1
            has_steps = bool(batch.completions[j].strip())
            if s.parent is None and has_steps and not bool(batch.correct[j]):
                s.parent = (batch, j)
            elif len(s.group1) < config.n_fresh:
                s.group1.append((batch, j))


def _top_up(policy: Policy, task: Task, problems: Sequence[Problem], searches: list[_Search], config: ResetConfig,
            sampling: SamplingConfig, generator: torch.Generator) -> int:
    """Fill each Group 1 to n_fresh (n_fresh + n_reset when no parent was found: the plain-group
    fallback) with fresh draws outside the search budget, in one sampling call; returns tokens generated."""
    requests = []
    for p, s in enumerate(searches):
        size = config.n_fresh if s.parent is not None else config.n_fresh + config.n_reset
        requests += [p] * max(size - len(s.group1), 0)
    if not requests:
        return 0
    batch = sample_groups(policy, task, [problems[p] for p in requests], 1, sampling, generator)
    for j, p in enumerate(requests):
        searches[p].group1.append((batch, j))
    return int(batch.completion_mask.sum())


def _rows(parts: list[tuple[Rollouts, int]], group_id: int, pad_id: int) -> Rollouts:
    rows = concat_rollouts([source.select([j]) for source, j in parts], pad_id)
    return rows.with_fields(group=torch.full((rows.batch_size,), group_id, dtype=torch.long))


def collect_resets(policy: Policy, task: Task, draw: Callable[[int], list[Problem]], prompts: int, config: ResetConfig,
                   sampling: SamplingConfig, generator: torch.Generator, probe: Probe, rng: random.Random) -> Collected:
    problems = draw(prompts)
    searches, generated = search_parents(policy, task, problems, config, sampling, generator)
    draws = sum(s.draws for s in searches)
    generated += _top_up(policy, task, problems, searches, config, sampling, generator)
    with_parent = [p for p, s in enumerate(searches) if s.parent is not None]
    steps: dict[int, tuple[int, int]] = {}  # prompt -> (reset step, cut in completion tokens)
    if with_parent:  # localise every parent in one call (each parent its own group: no cross-prompt leakage)
        parents = _rows([searches[p].parent for p in with_parent], 0, policy.pad_id)
        parents = parents.with_fields(group=torch.arange(len(with_parent)))
        segment_ids = probe.segment(parents, config.segmenter)
        picks = localise(config.localiser, parents, list(range(len(with_parent))), probe, segment_ids, rng,
                         config.prompt_temperature, config.value_drop, prompt_max_new_tokens=config.prompt_max_new_tokens)
        bounds = segment_bounds(segment_ids)
        for i, p in enumerate(with_parent):
            step = max(picks[i] - config.backoff, 0)
            steps[p] = (step, bounds[i][step][0] if bounds[i] else 0)
    parts = [_rows(s.group1, 2 * p, policy.pad_id) for p, s in enumerate(searches)]
    details: dict[str, Any] = {"parents": {}, "reset_cuts": {}}
    if with_parent:  # Group 2 of every prompt with a parent, in one sampling call
        jobs = [(*searches[p].parent, steps[p][1], 2 * p + 1) for p in with_parent]
        group2 = continue_from(policy, task, jobs, config.n_reset, sampling, generator)
        generated += int((group2.completion_mask & group2.loss_mask).sum())
        parts.append(group2)
        for (source, j, cut, _), p in zip(jobs, with_parent):
            details["parents"][p] = source.completion_ids[j][source.completion_mask[j]].tolist()
            details["reset_cuts"][p] = cut
    rollouts = concat_rollouts(parts, policy.pad_id)
    resets = [steps[p][0] for p in with_parent]
    return Collected(rollouts, generated, {"mixed_groups": float(mixed_groups(rollouts).float().mean()),
                                           "reset_fallbacks": float(len(problems) - len(with_parent)),
                                           "fresh_draws_per_prompt": draws / max(len(problems), 1),
                                           "reset_step_mean": float(sum(resets) / len(resets)) if resets else 0.0},
                     details)


