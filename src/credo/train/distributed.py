"""Data parallelism for credo's trainer: several processes (gloo on CPU, NCCL on GPUs) via accelerate.

Launch with `accelerate launch --num_processes N -m credo.cli train ... --set data_parallel=true` (or torchrun).
`Sharded` wraps the run's strategy: every rank draws the same prompts; prompt i is collected alone with its
own generator seeded by (seed, step, i), so the completions do not depend on how prompts are split across
ranks, and a run on N processes sees the same global batch as a run on one. Each rank takes prompts rank::N
(whole groups, so group statistics stay local), computes credit for its rows, and gradients are averaged
across ranks before the optimiser step; the token-mean loss is rescaled by the global token count so the average
is the global loss.
Batch-wide credit statistics (RREDCoT's z, SC-GRPO's quantile) are gathered over all ranks (Probe.gather).
With `minibatches=1` an N-process run ends with the weights of a one-process run (tests/test_distributed.py);
with more minibatches each rank draws its minibatches from its own rows, so the optimiser takes the same number
of steps on a different grouping of rows (equally valid, not bit-equal to one process).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from credo.core.rollouts import Cost, Rollouts, concat_rollouts
from credo.strategies import Collected, SamplingContext, Strategy
from credo.strategies.sampling import mixed_share
from credo.core.protocols import Problem


class DataParallel:
    """Rank/world bookkeeping and the few collectives the trainer needs (a no-op world of one is fine)."""

    def __init__(self) -> None:
        from accelerate import PartialState
        self.state = PartialState(cpu=not torch.cuda.is_available())
        self.world = self.state.num_processes
        self.rank = self.state.process_index

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> list[int]:
        return list(range(self.rank, n, self.world))

    def sum(self, value: float) -> float:
        if self.world == 1:
            return float(value)
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.state.device)
        torch.distributed.all_reduce(t)
        return float(t.item())

    def mean(self, value: float) -> float:
        return self.sum(value) / self.world

    def average_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        if self.world == 1:
            return
        for p in parameters:
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad /= self.world

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def group_generator(seed: int, step: int, prompt_index: int) -> torch.Generator:
    """The generator that samples prompt `prompt_index`'s group at `step` (independent of the rank layout)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step * 10_007 + prompt_index) % (2**63 - 1))


class Sharded:
    """Data parallelism over any strategy: this rank's share (rank::world) of the step's prompts, each collected
    alone by `inner` with its own generator (`group_generator`), so the global batch does not depend on the
    rank layout. Prompt i's groups are renumbered i + j * n_prompts (j: the group's index within the prompt),
    unique over the whole batch; a plain group keeps id i. Counts and statistics are global (summed or
    averaged over ranks); the strategy's Probe cost stays this rank's (the trainer sums it with the credit's).
    A strategy that draws more prompts than it was asked for (dynamic sampling) would draw different prompts
    on each rank, so each prompt's sub-collection may draw exactly its one prompt."""

    def __init__(self, inner: Strategy, dp: DataParallel, seed: int) -> None:
        self.inner, self.dp, self.seed = inner, dp, seed

    def collect(self, ctx: SamplingContext, n_prompts: int) -> Collected:
        problems = ctx.draw(n_prompts)
        parts = []
        for i in self.dp.shard(len(problems)):
            alone = replace(ctx, draw=_only(problems[i]), generator=group_generator(self.seed, ctx.step, i))
            part = self.inner.collect(alone, 1)
            parts.append(replace(part, rollouts=_renumbered(part.rollouts, i, len(problems))))
        rollouts = concat_rollouts([p.rollouts for p in parts], ctx.policy.pad_id)
        info = {"mixed_groups": self.dp.mean(mixed_share(rollouts))}  # over this rank's groups, then the ranks
        for key in [k for k in parts[0].info if k not in info]:  # the others: means over prompts, then ranks
            info[key] = self.dp.mean(sum(p.info[key] for p in parts) / len(parts))
        generated = int(self.dp.sum(sum(p.tokens_generated for p in parts)))
        return Collected(rollouts, generated, info, cost=sum((p.cost for p in parts), Cost()),
                         sampled_logprobs=all(p.sampled_logprobs for p in parts))


def _only(problem: Problem) -> Callable[[int], list[Problem]]:
    """A draw that hands out `problem` once."""
    left = [problem]

    def draw(n: int) -> list[Problem]:
        if n != len(left):
            raise ValueError("data parallelism collects each prompt alone: a strategy may draw only the prompt "
                             "it was given (use data_parallel with a strategy that draws each prompt once)")
        out, left[:] = list(left), []
        return out

    return draw


def _renumbered(rollouts: Rollouts, index: int, n_prompts: int) -> Rollouts:
    """Group ids of prompt `index`'s rows -> index + j * n_prompts, j the group's rank among the prompt's ids."""
    _, local = torch.unique(rollouts.group, return_inverse=True)
    return rollouts.with_fields(group=index + local * n_prompts)
