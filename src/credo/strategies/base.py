"""The Strategy protocol, the sampling context every strategy reads, and the strategy registry.

A strategy is a function `(ctx, n_prompts, config) -> Collected` registered with
`@register(name, description, ConfigClass)`; `make(name, options)` binds it to its config and
returns the `Strategy` the trainer calls: `strategy.collect(ctx, n_prompts)`. Whatever the strategy
spends through `ctx.probe` (a localiser scoring or sampling) is metered into `Collected.cost`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import torch

from credo.core.protocols import Policy, Problem, SamplingConfig, Task
from credo.core.probe import Probe
from credo.core.rollouts import Cost, Rollouts
from credo.core.registry import Registry


@dataclass
class Collected:
    """A step's training rows and what producing them cost.

    tokens_generated: every token the strategy sampled itself (discarded groups and parent searches included).
    info: per-step statistics for metrics.jsonl (`mixed_groups`, ...).
    details: what the strategy did that its rows do not show, for inspection; no trainer code reads it (tests
    check the rows against it). The resets strategy: `parents` {prompt index: its parent's completion tokens
    (a row never trained on)} and `reset_cuts` {prompt index: the token where its Group 2 rows were cut};
    the other strategies leave it empty.
    cost: what the strategy spent through the Probe (a localiser's scoring or sampling); filled by the registry.
    sampled_logprobs: rollouts.old_logprobs are the sampler's own log-probabilities of every completion token
    (False: placeholders, as the resets strategy's reset rows carry; the trainer then always re-scores them).
    """

    rollouts: Rollouts
    tokens_generated: int
    info: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    cost: Cost = field(default_factory=Cost)
    sampled_logprobs: bool = True


@dataclass(frozen=True)
class SamplingContext:
    """Everything a strategy may use to produce a step's rows.

    draw(n) -> the next n training problems (the run's problem stream); generator: the completions' stream;
    probe: counted, gradient-free model access (None for strategies that never localise); rng: python-side
    choices (the random localiser); group_size: completions per prompt (strategies with their own group sizes,
    e.g. resets, ignore it); step: optimisation steps done so far.
    """

    policy: Policy
    task: Task
    draw: Callable[[int], list[Problem]]
    sampling: SamplingConfig
    generator: torch.Generator
    probe: Probe | None = None
    rng: random.Random | None = None
    group_size: int = 8
    step: int = 0


class Strategy(Protocol):
    """Produces one step's training rows: n_prompts prompts' groups, with rewards from the task's verifier."""

    def collect(self, ctx: SamplingContext, n_prompts: int) -> Collected: ...


STRATEGIES = Registry("strategy")
register = STRATEGIES.register


@dataclass(frozen=True)
class RegisteredStrategy:
    """A registered strategy function bound to its config: the `Strategy` the trainer calls."""

    name: str
    fn: Callable[[SamplingContext, int, Any], Collected]
    config: Any

    def collect(self, ctx: SamplingContext, n_prompts: int) -> Collected:
        if ctx.probe is None:
            return self.fn(ctx, n_prompts, self.config)
        with ctx.probe.metered() as spent:
            collected = self.fn(ctx, n_prompts, self.config)
        return replace(collected, cost=spent)


def make(name: str, options: Any = None, prefix: str = "train.") -> RegisteredStrategy:
    """The strategy registered as `name`, bound to its config (`options`: an instance of its config class or a
    dict of its fields). An unknown name is a ConfigError naming it and every registered strategy."""
    entry = STRATEGIES.get(name)
    return RegisteredStrategy(name, entry.fn, entry.make_config(options, prefix))
