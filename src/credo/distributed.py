"""Data parallelism for credo's trainer: several processes (gloo on CPU, NCCL on GPUs) via accelerate.

Launch with `accelerate launch --num_processes N -m credo.cli train ... --set data_parallel=true` (or torchrun).
Every rank draws the same prompts; prompt i's group is sampled with its own generator seeded by
(seed, step, i), so the completions do not depend on how prompts are split across ranks, and a run on N
processes sees the same global batch as a run on one. Each rank takes prompts rank::N (whole groups, so group
statistics stay local), computes credit for its rows, and gradients are averaged across ranks before the
optimiser step; the token-mean loss is rescaled by the global token count so the average is the global loss.
Batch-wide credit statistics (RREDCoT's z, SC-GRPO's quantile) are gathered over all ranks (Probe.gather).
With `minibatches=1` an N-process run ends with the weights of a one-process run (tests/test_distributed.py);
with more minibatches each rank draws its minibatches from its own rows, so the optimiser takes the same number
of steps on a different grouping of rows (equally valid, not bit-equal to one process).
"""

from __future__ import annotations

import torch


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
