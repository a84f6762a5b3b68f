"""RRPO / SRPO reset rollouts: return to a state of a failed trace and resample what follows it.

Per prompt (defaults of the public code, n = 8):
  Group 1  `n_fresh` fresh completions (trained on, whole completion);
  parent   a failed completion found by sampling up to `max_fresh_attempts` more (never trained on);
  reset    step k of the parent chosen by a localiser (minus `backoff` steps, floored at 0);
  Group 2  `n_reset` continuations from prompt + the parent's steps < k; trained on the suffix only
           (the prefix is masked out of the loss).
The two groups get separate group ids, so advantages are normalised inside each. When no failure
is found, one plain group of n_fresh + n_reset fresh completions is used instead.

Localisers (which step is the first error?):
  random  uniform over the parent's steps (RRPO);
  value   the first step whose drop in the policy's own suffix value exceeds `value_drop` (SRPO,
          ours, for models that cannot follow instructions; see `localise_by_value`);
  prompt  ask the policy (temperature 0.3) for the first wrong step of the numbered steps, told only
          that the answer is wrong; the last integer of its reply, clamped; the middle step when
          unparsable (SRPO for instruction models; needs a task with `localisation_prompt`);
  oracle  the task's labelled first wrong step (synthetic tasks only: the credit-assignment oracle).
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

LOCALISERS = ("random", "value", "prompt", "oracle")


@dataclass(frozen=True)
class ResetConfig:
    """n_fresh / n_reset: sizes of Group 1 and Group 2. max_fresh_attempts: samples spent looking for
    a failed parent. localiser: random | value | prompt | oracle. backoff: reset this many steps
    earlier than localised. segmenter: what a step is. prompt_temperature: the prompt localiser's
    sampling temperature. value_drop: the value localiser's threshold on a step's value drop."""

    n_fresh: int = 4
    n_reset: int = 4
    max_fresh_attempts: int = 12
    localiser: str = "random"
    backoff: int = 0
    segmenter: Any = "lines"
    prompt_temperature: float = 0.3
    value_drop: float = 0.05

    def __post_init__(self) -> None:
        check(self.n_fresh >= 2 and self.n_reset >= 2, f"reset.n_fresh and reset.n_reset must be >= 2, got {self.n_fresh}/{self.n_reset}")
        check(self.max_fresh_attempts >= 1, f"reset.max_fresh_attempts must be >= 1, got {self.max_fresh_attempts}")
        check(self.localiser in LOCALISERS, f"reset.localiser must be one of {LOCALISERS}, got {self.localiser!r}")
        check(self.backoff >= 0, f"reset.backoff must be >= 0, got {self.backoff}")
        check(0 < self.value_drop < 1, f"reset.value_drop must be in (0, 1), got {self.value_drop}")
        segmenter_config(self.segmenter)


def parse_step_index(reply: str, n_steps: int) -> int:
    """0-based step from a localisation reply: the last integer (1-based), clamped; middle if none."""
    numbers = re.findall(r"-?\d+", reply)
    if not numbers:
        return (n_steps - 1) // 2
    return min(max(int(numbers[-1]) - 1, 0), n_steps - 1)


def localise(name: str, rollouts: Rollouts, rows: Sequence[int], probe: Probe, segment_ids: torch.Tensor,
             rng: random.Random, prompt_temperature: float = 0.3, value_drop: float = 0.05) -> list[int]:
    """The 0-based step to reset at for each row in `rows` (each a failed trace)."""
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
        builder = getattr(probe.task, "localisation_prompt", None)
        if builder is None:
            raise ValueError(f"the prompt localiser needs a task with localisation_prompt (chat models); "
                             f"task {getattr(probe.task, 'name', '?')!r} has none: use value, random or oracle")
        policy = probe.policy
        prompts = []
        for row in rows:
            steps = [policy.decode(rollouts.completion_ids[row, a:b]) for a, b in segment_bounds(segment_ids[[row]])[0]]
            prompts.append(builder(rollouts.problems[row], steps))
        ids, mask = policy.encode_prompts(prompts)
        out = probe.sample(ids, mask, SamplingConfig(prompt_temperature, 1.0, 16))
        replies = [policy.decode(r) for r in out.completion_ids]
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


def continue_from(policy: Policy, task: Task, base: Rollouts, row: int, cut: int, n: int, sampling: SamplingConfig,
                  generator: torch.Generator, group_id: int) -> Rollouts:
    """n continuations of base row `row` after its first `cut` completion tokens, as completions
    prefix + continuation with the prefix masked out of the loss."""
    prefix = base.completion_ids[row, :cut].tolist()
    prompt = prompt_tokens(base.prompt_ids, base.prompt_mask, row)
    ids, mask = left_pad([prompt + prefix] * n, policy.pad_id, base.prompt_ids.device)
    out = policy.sample(ids, mask, sampling, generator)
    completions = [prefix + c[m].tolist() for c, m in zip(out.completion_ids, out.completion_mask)]
    comp_ids, comp_mask = right_pad(completions, policy.pad_id, base.prompt_ids.device)
    texts = [policy.decode(torch.tensor(c, dtype=torch.long)) for c in completions]
    problem = base.problems[row]
    rewards, correct = rewards_for(task, [problem] * n, texts)
    p_ids, p_mask = left_pad([prompt] * n, policy.pad_id, base.prompt_ids.device)
    loss_mask = comp_mask.clone()
    loss_mask[:, :cut] = False
    return Rollouts(p_ids, p_mask, comp_ids, comp_mask, torch.full((n,), group_id, dtype=torch.long), rewards,
                    torch.zeros(comp_ids.shape), correct, [problem] * n, texts, loss_mask=loss_mask)


def collect_resets(policy: Policy, task: Task, draw: Callable[[int], list[Problem]], prompts: int, config: ResetConfig,
                   sampling: SamplingConfig, generator: torch.Generator, probe: Probe, rng: random.Random) -> Collected:
    problems = draw(prompts)
    group1 = sample_groups(policy, task, problems, config.n_fresh, sampling, generator)
    generated = int(group1.completion_mask.sum())
    parents: dict[int, tuple[Rollouts, int]] = {}
    attempts = 0
    pending = list(range(len(problems)))
    while pending and attempts < config.max_fresh_attempts:
        tries = sample_groups(policy, task, [problems[p] for p in pending], 1, sampling, generator)
        generated += int(tries.completion_mask.sum())
        attempts += 1
        still = []
        for j, p in enumerate(pending):
            if not bool(tries.correct[j]):
                parents[p] = (tries, j)
            else:
                still.append(p)
        pending = still
    parts: list[Rollouts] = []
    resets, fallback = [], 0
    details: dict[str, Any] = {"parents": {}, "reset_cuts": {}}
    for p in range(len(problems)):
        rows = (group1.group == p).nonzero().squeeze(1)
        g1 = group1.select(rows).with_fields(group=torch.full((len(rows),), 2 * p, dtype=torch.long))
        if p not in parents:  # no failure found: one plain group of n_fresh + n_reset
            extra = sample_groups(policy, task, [problems[p]], config.n_reset, sampling, generator)
            generated += int(extra.completion_mask.sum())
            parts.append(concat_rollouts([g1, extra.with_fields(group=torch.full((config.n_reset,), 2 * p, dtype=torch.long))], policy.pad_id))
            fallback += 1
            continue
        source, j = parents[p]
        segment_ids = probe.segment(source.select([j]), config.segmenter)
        step = localise(config.localiser, source, [j], probe, _pad_to(segment_ids, source, j), rng, config.prompt_temperature,
                        config.value_drop)[0]
        step = max(step - config.backoff, 0)
        bounds = segment_bounds(segment_ids)[0]
        cut = bounds[step][0] if bounds else 0
        g2 = continue_from(policy, task, source, j, cut, config.n_reset, sampling, generator, 2 * p + 1)
        details["parents"][p] = source.completion_ids[j][source.completion_mask[j]].tolist()
        details["reset_cuts"][p] = cut
        generated += int((g2.completion_mask & g2.loss_mask).sum())
        parts.extend([g1, g2])
        resets.append(step)
    rollouts = concat_rollouts(parts, policy.pad_id)
    return Collected(rollouts, generated, {"mixed_groups": float(mixed_groups(rollouts).float().mean()),
                                           "reset_fallbacks": float(fallback),
                                           "reset_step_mean": float(sum(resets) / len(resets)) if resets else 0.0},
                     details)


def _pad_to(segment_ids: torch.Tensor, source: Rollouts, row: int) -> torch.Tensor:
    """segment_ids of one selected row placed at index `row` of a [B, T] tensor for `source`."""
    full = torch.full(source.completion_ids.shape, -1, dtype=torch.long)
    full[row, :segment_ids.shape[1]] = segment_ids[0]
    return full
