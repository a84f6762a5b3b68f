"""Group sampling and the two strategies built on it alone.

- `plain`: G completions for each of the step's prompts.
- `dynamic` (DAPO): drop groups whose rewards are all equal and sample fresh prompts until the
  batch holds `n_prompts` informative groups (or `max_rounds` is spent; then the batch is
  topped up with uninformative groups so its size stays fixed).
Every generated token is counted, including those of discarded groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from credo.core.config import check
from credo.core import groups
from credo.core.protocols import Policy, Problem, SamplingConfig, Task, rewards_for
from credo.core.rollouts import Rollouts, concat_rollouts
from credo.strategies.base import Collected, SamplingContext, register


def sample_groups(policy: Policy, task: Task, problems: Sequence[Problem], group_size: int,
                  sampling: SamplingConfig, generator: torch.Generator, group_offset: int = 0) -> Rollouts:
    """G completions per problem -> Rollouts (rewards from the task; old_logprobs from sampling)."""
    repeated = [p for p in problems for _ in range(group_size)]
    prompt_ids, prompt_mask = policy.encode_prompts([p.prompt for p in repeated])
    out = policy.sample(prompt_ids, prompt_mask, sampling, generator)
    texts = [policy.decode(row) for row in out.completion_ids]
    rewards, correct = rewards_for(task, repeated, texts)
    group = (torch.arange(len(problems)).repeat_interleave(group_size) + group_offset).to(prompt_ids.device)
    return Rollouts(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=out.completion_ids,
                    completion_mask=out.completion_mask, group=group, rewards=rewards.to(prompt_ids.device),
                    old_logprobs=out.logprobs, correct=correct.to(prompt_ids.device), problems=repeated,
                    completions=texts)


def sample_scored(policy: Policy, task: Task, problems: Sequence[Problem], group_size: int,
                  sampling: SamplingConfig, generator: torch.Generator) -> Rollouts:
    """sample_groups, with old_logprobs[B, T] rescored by the policy's training forward (no grad), as the trainer's
    prepare phase has them: the batch the audit and `credo show` measure credit on."""
    rollouts = sample_groups(policy, task, problems, group_size, sampling, generator)
    with torch.no_grad():
        old, _ = policy.score(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids,
                              rollouts.completion_mask)
    return rollouts.with_fields(old_logprobs=old)


def mixed_groups(rollouts: Rollouts) -> torch.Tensor:
    """[n_groups] bool over the sorted unique group ids: True where rewards differ inside the group."""
    return groups.mixed_group_mask(rollouts.group, rollouts.rewards)


def mixed_share(rollouts: Rollouts) -> float:
    """The share of groups whose rewards differ (the `mixed_groups` metric)."""
    return float(mixed_groups(rollouts).float().mean())


@register("plain", "G completions for each of the step's prompts")
def collect_plain(ctx: SamplingContext, n_prompts: int, config: None = None) -> Collected:
    rollouts = sample_groups(ctx.policy, ctx.task, ctx.draw(n_prompts), ctx.group_size, ctx.sampling, ctx.generator)
    return Collected(rollouts, int(rollouts.completion_mask.sum()), {"mixed_groups": mixed_share(rollouts)})


@dataclass(frozen=True)
class DynamicConfig:
    """max_rounds: sampling rounds per step before the batch is topped up with uninformative groups."""

    max_rounds: int = 4

    def __post_init__(self) -> None:
        check(self.max_rounds >= 1, f"dynamic_max_rounds must be >= 1, got {self.max_rounds}")


@register("dynamic",
          "DAPO dynamic sampling: drop groups whose rewards are all equal, refill with new prompts", DynamicConfig,
          settings=lambda train: {"max_rounds": train.dynamic_max_rounds})
def collect_dynamic(ctx: SamplingContext, n_prompts: int, config: DynamicConfig) -> Collected:
    kept: list[Rollouts] = []
    spare: list[Rollouts] = []
    generated, n_kept, offset, rounds, first_mixed = 0, 0, 0, 0, None
    while n_kept < n_prompts and rounds < config.max_rounds:
        batch = sample_groups(ctx.policy, ctx.task, ctx.draw(n_prompts - n_kept if rounds else n_prompts),
                              ctx.group_size, ctx.sampling, ctx.generator, group_offset=offset)
        generated += int(batch.completion_mask.sum())
        ids = torch.unique(batch.group)
        offset = int(ids.max()) + 1
        mixed = mixed_groups(batch)
        first_mixed = float(mixed.float().mean()) if first_mixed is None else first_mixed
        for gid, is_mixed in zip(ids.tolist(), mixed.tolist()):
            rows = (batch.group == gid).nonzero().squeeze(1)
            if is_mixed and n_kept < n_prompts:
                kept.append(batch.select(rows))
                n_kept += 1
            else:
                spare.append(batch.select(rows))
        rounds += 1
    kept.extend(spare[:n_prompts - n_kept])  # top up so the batch size stays fixed
    rollouts = concat_rollouts(kept, ctx.policy.pad_id)
    return Collected(rollouts, generated, {"mixed_groups": first_mixed or 0.0, "sampling_rounds": float(rounds),
                                           "kept_mixed": n_kept / n_prompts})
