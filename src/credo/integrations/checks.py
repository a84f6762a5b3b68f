"""Credit sanity checks the TRL and verl adapters run on every batch, before the update (credo.checks).

On by default; one flag turns them off (`CreditGRPOTrainer(credit_checks=False)`, `apply_credit(checks=False)`,
`+credo.checks=false`, `register_with_verl(checks=False)`). A failed check raises `CreditCheckError`, one
line naming the check, the row and the step; it is raised before the adapter returns the advantages, so
the trainer never takes the update. The checks (B rows, T response tokens):

  rewards_finite     rewards[B] finite (a NaN would silently zero or poison its group's advantages).
  groups_whole       the rows credo groups together share one prompt, and no group is on two processes
                     (a group split across processes is normalised over part of its rows).
  advantages_finite  advantages[B, T] finite.
  aligned            the advantages have the response's shape, the estimator read the same token masks the
                     trainer's loss uses, and the loss mask marks only real (non-padding) tokens.
  zero_on_padding    advantages are 0 on padding.
  zero_on_masked     advantages are 0 on real tokens the loss leaves out (tool outputs, an estimator's mask).
  group_sums         GRPO family (grpo, dr_grpo, rloo): one advantage per row, summing to ~0 over each group.

group_sums tolerance: |sum_g A_i| <= GROUP_SUM_RTOL * sum_g |A_i| + GROUP_SUM_ATOL, per group (sums in float64).
The advantages are float32: centring G rewards and dividing by the group's std rounds each row (float32 unit
roundoff 6e-8) and the rounding of the group mean shifts all G rows alike, so a correct group's sum is a
few G * 6e-8 of sum |A_i|; the worst over 10,000 random groups of 2..64 rows (uniform and 0/1 rewards; grpo,
dr_grpo, rloo) was 5.5e-6. 1e-4 leaves an 18x margin, while the faults it is there for (a NaN read as 0,
padding or another group's rows in the mean) move the sum by a whole row's share, about 1 / G of sum |A_i|
(>= 1.5e-2 for G <= 64). Groups of one row (verl scores them as they are) and groups with a row that has no
trainable token (its advantage is not in the [B, T] tensor: TRL's mask_truncated_completions) are not summed.
GRPO-family rows must also hold one value over their trainable tokens (spread <= 1e-4 x max(1, |A_i|)).

The masked-perturbation invariance check (opt-in: it reruns the estimator) is in leak_check.py and re-exported
here: `check_masked_invariance`, `check_estimator_invariance`, `MaskedInputs`.

All checks are vectorised tensor operations on the batch (no model calls); `groups_whole` across processes
costs one collective (two all_gathers of the shard's group ids), the same `gather` the estimators use.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from credo.core.config import UserError

ZERO_SUM_ESTIMATORS = ("grpo", "dr_grpo", "rloo")
"""Estimators whose advantage is one number per row, centred within its group."""
GROUP_SUM_RTOL = 1e-4
GROUP_SUM_ATOL = 1e-6


class CreditCheckError(UserError):
    """A credit sanity check failed; the message names the check, the row and the step."""


@dataclass(frozen=True)
class Where:
    """Where a batch comes from, for the error message. step: the trainer's step. row_name(i): how to name
    local row i (a global row index, a verl uid). off: how to turn the checks off, for the message."""

    step: Any
    off: str
    row_name: Callable[[int], str] = lambda i: f"row {i}"

    def fail(self, check: str, row: int, detail: str) -> CreditCheckError:
        return CreditCheckError(f"credo check {check} failed at step {self.step}, {self.row_name(row)}: {detail}; "
                                f"the update was not applied ({self.off} turns the checks off)")


def _first(bad: torch.Tensor) -> tuple[int, int] | None:
    """(row, token) of the first True of bad[B, T] (or (row, -1) for bad[B]), None when all False."""
    if not bool(bad.any()):
        return None
    index = bad.nonzero()[0].tolist()
    return int(index[0]), int(index[1]) if len(index) > 1 else -1


def check_rewards(rewards: torch.Tensor, where: Where, what: str = "reward") -> None:
    """rewards[B] must be finite."""
    hit = _first(~torch.isfinite(rewards))
    if hit is not None:
        raise where.fail("rewards_finite", hit[0], f"{what} is {float(rewards[hit[0]])} "
                         f"({int((~torch.isfinite(rewards)).sum())} of {rewards.numel()} rows not finite)")


def _mixed_rows(group: torch.Tensor, prompts: torch.Tensor | Sequence[Any]) -> torch.Tensor:
    """bool[B]: rows whose prompt differs from the prompt of their group's first row. prompts: a tensor
    [B, ...] (token ids, padding included) or a sequence of comparable values."""
    _, inverse = torch.unique(group.cpu(), return_inverse=True)
    first = torch.full((int(inverse.max()) + 1 if len(inverse) else 0,), len(inverse), dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(len(inverse)), "amin")[inverse]
    if isinstance(prompts, torch.Tensor):
        ids = prompts.cpu()
        return (ids != ids[first]).reshape(len(ids), -1).any(1)
    values = list(prompts)
    return torch.tensor([values[i] != values[int(f)] for i, f in enumerate(first.tolist())], dtype=torch.bool)


def check_groups(group: torch.Tensor, prompts: torch.Tensor | Sequence[Any], where: Where,
                 gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 global_keys: torch.Tensor | None = None) -> None:
    """group[B]: each row's group id. prompts: each row's prompt (see _mixed_rows): a group's rows must
    share it. gather (several processes): each group's key (global_keys[B], default group) must be on one
    process only; every process must call this (it is a collective)."""
    mixed = _first(_mixed_rows(group, prompts))
    if mixed is not None:
        raise where.fail("groups_whole", mixed[0], f"the rows of its group {int(group[mixed[0]])} hold different "
                         "prompts (a group split across processes, or rows dealt out of group order)")
    if gather is None:
        return
    keys = (group if global_keys is None else global_keys).cpu().to(torch.float64)
    local = torch.unique(keys)
    everywhere = gather(local)
    values, counts = torch.unique(everywhere, return_counts=True)
    shared = values[counts > 1]
    if len(shared):
        row = int(torch.isin(keys, shared).nonzero()[0])
        raise where.fail("groups_whole", row, f"its group is also on another process ({len(shared)} group(s) "
                         "split across processes: each would be normalised over part of its rows)")


def string_keys(values: Sequence[Any]) -> torch.Tensor:
    """float64-exact keys[B] (< 2**48) of any values (verl uids), equal values -> equal keys, for check_groups'
    cross-process gather (which sends float64)."""
    cache: dict[str, int] = {}
    out = []
    for v in values:
        text = str(v)
        if text not in cache:
            cache[text] = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), "big")
        out.append(cache[text])
    return torch.tensor(out, dtype=torch.float64)


def check_advantages(advantages: torch.Tensor, real: torch.Tensor, trainable: torch.Tensor, where: Where, *,
                     credit_real: torch.Tensor | None = None, credit_trainable: torch.Tensor | None = None) -> None:
    """advantages[B, T] as the trainer will use them. real[B, T]: the trainer's non-padding response tokens.
    trainable[B, T]: the tokens its loss counts. credit_real / credit_trainable: the masks the estimator
    read (None: the trainer's, by construction)."""
    if advantages.shape != real.shape or trainable.shape != real.shape:
        raise where.fail("aligned", 0, f"advantages {tuple(advantages.shape)}, response mask {tuple(real.shape)} "
                         f"and loss mask {tuple(trainable.shape)} differ in shape")
    hit = _first(~torch.isfinite(advantages))
    if hit is not None:
        raise where.fail("advantages_finite", hit[0], f"advantage of token {hit[1]} is {float(advantages[hit])}")
    real, trainable = real.bool(), trainable.bool()
    hit = _first(trainable & ~real)
    if hit is not None:
        raise where.fail("aligned", hit[0], f"the loss mask marks token {hit[1]}, which is padding (a mask shifted "
                         "against the response)")
    for name, ours, theirs in (("response", credit_real, real), ("loss", credit_trainable, trainable)):
        if ours is None:
            continue
        hit = _first(ours.to(theirs.device).bool() != theirs)
        if hit is not None:
            raise where.fail("aligned", hit[0], f"the credit was computed under a {name} mask that differs from the "
                             f"trainer's at token {hit[1]} (credit {int(ours[hit])}, trainer {int(theirs[hit])})")
    nonzero = advantages != 0
    hit = _first(nonzero & ~real)
    if hit is not None:
        raise where.fail("zero_on_padding", hit[0], f"padding token {hit[1]} has advantage {float(advantages[hit])}")
    hit = _first(nonzero & real & ~trainable)
    if hit is not None:
        raise where.fail("zero_on_masked", hit[0], f"token {hit[1]}, outside the loss mask, has advantage "
                         f"{float(advantages[hit])}")


def check_group_sums(advantages: torch.Tensor, trainable: torch.Tensor, group: torch.Tensor, where: Where) -> None:
    """GRPO family: advantages[B, T] one value per row over trainable[B, T], summing to ~0 in each group[B]
    of two or more rows (tolerance: module docstring)."""
    mask = trainable.bool()
    values = advantages.double() * mask
    counts = mask.sum(1)
    per_row = values.sum(1) / counts.clamp(min=1)
    spread = (values - per_row[:, None]).abs().masked_fill(~mask, 0).amax(1) if values.numel() else per_row
    hit = _first(spread > GROUP_SUM_RTOL * per_row.abs().clamp(min=1.0))
    if hit is not None:
        raise where.fail("group_sums", hit[0], f"its advantage varies over its tokens by {float(spread[hit[0]]):.3g} "
                         "(a GRPO-family advantage is one number per row: a shifted mask?)")
    group = group.to(per_row.device)
    _, inverse, sizes = torch.unique(group, return_inverse=True, return_counts=True)
    n = len(sizes)
    sums = torch.zeros(n, dtype=torch.float64, device=per_row.device).index_add_(0, inverse, per_row)
    scale = torch.zeros_like(sums).index_add_(0, inverse, per_row.abs())
    empty = torch.zeros(n, dtype=torch.long, device=per_row.device).index_add_(0, inverse, (counts == 0).long()) > 0
    bad = (sums.abs() > GROUP_SUM_RTOL * scale + GROUP_SUM_ATOL) & (sizes > 1) & ~empty
    hit = _first(bad[inverse])
    if hit is not None:
        g = int(inverse[hit[0]])
        raise where.fail("group_sums", hit[0], f"its group's {int(sizes[g])} advantages sum to {float(sums[g]):.3g}, "
                         f"not ~0 (tolerance {GROUP_SUM_RTOL:g} x {float(scale[g]):.3g}): the group mean was taken "
                         "over other rows or values")


# the opt-in leak check, reachable as credo.checks.<name> (it raises Where.fail; it does not import this module)
from credo.integrations.leak_check import (MaskedInputs, check_estimator_invariance,  # noqa: E402,F401
                                           check_masked_invariance)
