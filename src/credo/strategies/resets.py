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
Which step is the first error is the localiser's call (random, value, prompt, oracle, self):
see credo.strategies.localisers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from credo.core.config import MAX_GROUP, MAX_STEP_COMPLETIONS, check, check_in
from credo.core.values import continue_and_verify
from credo.core.protocols import Problem, left_pad
from credo.policy.base import right_pad
from credo.core.probe import prompt_tokens
from credo.core.rollouts import Rollouts, concat_rollouts
from credo.core.segment import segment_bounds, segmenter_config
from credo.strategies.base import Collected, SamplingContext, register
from credo.strategies.localisers import LOCALISERS, localise
from credo.strategies.sampling import mixed_share, sample_groups


@dataclass(frozen=True)
class ResetConfig:
    """RRPO/SRPO reset rollouts: Group 1 fresh completions, Group 2 suffixes resampled from a failed parent."""

    n_fresh: int = 4
    """Size of Group 1 (fresh completions of the prompt)."""
    n_reset: int = 4
    """Size of Group 2 (suffixes resampled from the localised step of a failed parent)."""
    max_fresh_attempts: int = 12
    """Fresh draws per prompt spent filling Group 1 and looking for a failed parent (Group 1 included, as
    the public code)."""
    localiser: str = "random"
    """Where to reset: a registered localiser (random | value | prompt | oracle | self; `credo methods`)."""
    backoff: int = 0
    """Reset this many steps earlier than localised."""
    segmenter: Any = "lines"
    """What a step is: a segmenter name or mapping (credo.core.segment)."""
    prompt_temperature: float = 0.3
    """The prompt localiser's sampling temperature (the public code: 0.3)."""
    prompt_max_new_tokens: int = 4096
    """The prompt localiser's reply budget (the public code: 4096; a budget that cuts the reasoning short
    leaves the reply unparsable, which falls back to step 1)."""
    value_drop: float = 0.05
    """The value localiser's threshold on a step's value drop."""

    def __post_init__(self) -> None:
        check(self.n_fresh >= 2 and self.n_reset >= 2,
              f"reset.n_fresh and reset.n_reset must be >= 2, got {self.n_fresh}/{self.n_reset}")
        check(self.max_fresh_attempts >= 1, f"reset.max_fresh_attempts must be >= 1, got {self.max_fresh_attempts}")
        check_in(self.n_fresh, 2, MAX_GROUP, "reset.n_fresh")
        check_in(self.n_reset, 2, MAX_GROUP, "reset.n_reset")
        check_in(self.max_fresh_attempts, 1, MAX_STEP_COMPLETIONS, "reset.max_fresh_attempts")
        names = tuple(LOCALISERS.names())
        check(self.localiser in names, f"reset.localiser must be one of {names}, got {self.localiser!r}")
        check(self.backoff >= 0, f"reset.backoff must be >= 0, got {self.backoff}")
        check(self.prompt_temperature >= 0, f"reset.prompt_temperature must be >= 0, got {self.prompt_temperature}")
        check(self.prompt_max_new_tokens >= 1,
              f"reset.prompt_max_new_tokens must be >= 1, got {self.prompt_max_new_tokens}")
        check(0 < self.value_drop < 1, f"reset.value_drop must be in (0, 1), got {self.value_drop}")
        segmenter_config(self.segmenter)


def continue_from(ctx: SamplingContext, jobs: Sequence[tuple[Rollouts, int, int, int]], n: int) -> Rollouts:
    """For each (base, row, cut, group_id) job, n continuations of the base row after its first `cut`
    completion tokens, as completions prefix + continuation with the prefix masked out of the loss;
    all jobs in one sampling call, rows in job order, each job's rows under its group_id."""
    policy, device = ctx.policy, jobs[0][0].prompt_ids.device
    prompts, prefixes, problems, groups = [], [], [], []
    for base, row, cut, group_id in jobs:
        prompt = prompt_tokens(base.prompt_ids, base.prompt_mask, row)
        prefix = base.completion_ids[row, :cut].tolist()
        prompts += [prompt] * n
        prefixes += [prefix] * n
        problems += [base.problems[row]] * n
        groups += [group_id] * n
    out = continue_and_verify(lambda ids, mask: policy.sample(ids, mask, ctx.sampling, ctx.generator), policy,
                              ctx.task, problems, prompts, prefixes, device)
    comp_ids, comp_mask = right_pad(out.tokens, policy.pad_id, device)
    p_ids, p_mask = left_pad(prompts, policy.pad_id, device)
    loss_mask = comp_mask.clone()
    for i, prefix in enumerate(prefixes):
        loss_mask[i, :len(prefix)] = False
    return Rollouts(p_ids, p_mask, comp_ids, comp_mask, torch.tensor(groups, dtype=torch.long, device=device),
                    out.rewards.to(device), torch.zeros(comp_ids.shape, device=device), out.correct.to(device),
                    problems, out.texts, loss_mask=loss_mask)


@dataclass
class _Search:
    """One prompt's parent search: Group 1 rows so far, the parent (if found), fresh draws spent."""

    group1: list[tuple[Rollouts, int]]
    parent: tuple[Rollouts, int] | None = None
    draws: int = 0


def search_parents(ctx: SamplingContext, problems: Sequence[Problem], config: ResetConfig) -> tuple[list[_Search], int]:
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
        batch = sample_groups(ctx.policy, ctx.task, [problems[p] for p in requests], 1, ctx.sampling, ctx.generator)
        generated += int(batch.completion_mask.sum())
        for j, p in enumerate(requests):  # in draw order: the same outcome as drawing one at a time
            s = searches[p]
            s.draws += 1
            has_steps = bool(batch.completions[j].strip())
            if s.parent is None and has_steps and not bool(batch.correct[j]):
                s.parent = (batch, j)
            elif len(s.group1) < config.n_fresh:
                s.group1.append((batch, j))


def _top_up(ctx: SamplingContext, problems: Sequence[Problem], searches: list[_Search], config: ResetConfig) -> int:
    """Fill each Group 1 to n_fresh (n_fresh + n_reset when no parent was found: the plain-group
    fallback) with fresh draws outside the search budget, in one sampling call; returns tokens generated."""
    requests = []
    for p, s in enumerate(searches):
        size = config.n_fresh if s.parent is not None else config.n_fresh + config.n_reset
        requests += [p] * max(size - len(s.group1), 0)
    if not requests:
        return 0
    batch = sample_groups(ctx.policy, ctx.task, [problems[p] for p in requests], 1, ctx.sampling, ctx.generator)
    for j, p in enumerate(requests):
        searches[p].group1.append((batch, j))
    return int(batch.completion_mask.sum())


def _rows(parts: list[tuple[Rollouts, int]], group_id: int, pad_id: int) -> Rollouts:
    rows = concat_rollouts([source.select([j]) for source, j in parts], pad_id)
    return rows.with_fields(group=torch.full((rows.batch_size,), group_id, dtype=torch.long,
                                             device=rows.completion_ids.device))


def _reset_points(ctx: SamplingContext, searches: list[_Search], with_parent: list[int],
                  config: ResetConfig) -> dict[int, tuple[int, int]]:
    """prompt -> (reset step, cut in completion tokens) for every prompt with a parent, all parents localised in
    one call (each parent its own group: no cross-prompt leakage)."""
    parents = _rows([searches[p].parent for p in with_parent], 0, ctx.policy.pad_id)
    parents = parents.with_fields(group=torch.arange(len(with_parent), device=parents.completion_ids.device))
    segment_ids = ctx.probe.segment(parents, config.segmenter)
    picks = localise(config.localiser, parents, list(range(len(with_parent))), ctx.probe, segment_ids, ctx.rng,
                     config.prompt_temperature, config.value_drop, prompt_max_new_tokens=config.prompt_max_new_tokens)
    bounds = segment_bounds(segment_ids)
    steps = {}
    for i, p in enumerate(with_parent):
        step = max(picks[i] - config.backoff, 0)
        steps[p] = (step, bounds[i][step][0] if bounds[i] else 0)
    return steps


@register("resets", "RRPO/SRPO: reset a failed trace at a localised step and resample its suffix", ResetConfig,
          settings=lambda train: train.reset)
def collect_resets(ctx: SamplingContext, n_prompts: int, config: ResetConfig) -> Collected:
    problems = ctx.draw(n_prompts)
    searches, generated = search_parents(ctx, problems, config)
    draws = sum(s.draws for s in searches)
    generated += _top_up(ctx, problems, searches, config)
    with_parent = [p for p, s in enumerate(searches) if s.parent is not None]
    steps = _reset_points(ctx, searches, with_parent, config) if with_parent else {}
    parts = [_rows(s.group1, 2 * p, ctx.policy.pad_id) for p, s in enumerate(searches)]
    details: dict[str, Any] = {"parents": {}, "reset_cuts": {}}
    if with_parent:  # Group 2 of every prompt with a parent, in one sampling call
        jobs = [(*searches[p].parent, steps[p][1], 2 * p + 1) for p in with_parent]
        group2 = continue_from(ctx, jobs, config.n_reset)
        generated += int((group2.completion_mask & group2.loss_mask).sum())
        parts.append(group2)
        for (source, j, cut, _), p in zip(jobs, with_parent):
            details["parents"][p] = source.completion_ids[j][source.completion_mask[j]].tolist()
            details["reset_cuts"][p] = cut
    rollouts = concat_rollouts(parts, ctx.policy.pad_id)
    resets = [steps[p][0] for p in with_parent]
    return Collected(rollouts, generated, {"mixed_groups": mixed_share(rollouts),
                                           "reset_fallbacks": float(len(problems) - len(with_parent)),
                                           "fresh_draws_per_prompt": draws / max(len(problems), 1),
                                           "reset_step_mean": float(sum(resets) / len(resets)) if resets else 0.0},
                     details, sampled_logprobs=False)  # reset rows carry placeholder old log-probs
