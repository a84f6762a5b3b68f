"""`shuffled:of=<method>`: the control of a credit method (docs/methods.md, "## Controls").

The wrapped method runs as usual; then, in each trace, its segments' credit is permuted among the
segments (a seeded uniform permutation per trace), and its token weights move with the same
permutation. Magnitudes are kept, structure is destroyed: a method that does not beat its own
shuffled control gains nothing from *where* it puts credit.

Segments differ in length, so segment j receiving segment s's credit takes s's token pattern
resampled to j's length (nearest index) and shifted so its mean is exactly s's mean (weights are
rescaled instead, so they stay >= 0). Hence per trace the multiset of segment-mean credit is
unchanged, segment-constant credit (RREDCoT, VinePPO, LOO) is permuted exactly, a fixed point of
the permutation (and so a one-segment trace) is untouched, and padding stays zero.
Segments are the wrapped method's own (`segmenter` of its config) unless `segmenter` is given.

`level=token` is the structure-free control of token weights: each trace's credit (advantages and
weights, moved together) is permuted over all of its trainable completion tokens by one seeded
uniform permutation, so per trace the multiset of token credit is unchanged, padding stays zero and
where a value lands does not depend on its token. The segment level keeps a method's within-segment
pattern, and with it any bias by token type that is the same on every segment (on arith every line is
`a+b=c`): it answers "does it matter which *step* gets the credit?"; the token level answers "is it
the structure at all?" (docs/methods.md, "## Controls").
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.core.config import check
from credo.credit.compose import Wrapping, check_wrapped, wrapped_credit, wrapped_privileged
from credo.credit.registry import register
from credo.core.rollouts import Credit, Rollouts
from credo.core.segment import check_segmenter_option, segment_bounds, segments_for


LEVELS = ("segment", "token")


@dataclass(frozen=True)
class ShuffledConfig(Wrapping):
    """The shuffled control of a credit method (module docstring)."""

    of: str = "grpo"
    """The wrapped estimator (any registered one but shuffled itself)."""
    seed: int = 0
    """Seed of the permutations, combined with a digest of the batch: every batch gets its own permutations
    and the same batch always the same."""
    segmenter: Any = ""
    """The segments permuted: '' = the wrapped method's own (the batch's segments when it has none), or a
    segmenter name or mapping (credo.core.segment)."""
    level: str = field(default="segment", metadata={"omit_default": True})
    """'segment' (permute each trace's segments, the default) or 'token' (permute each trace's tokens: the
    structure-free control)."""
    options: dict = field(default_factory=dict)
    """The wrapped method's options; any key not named here lands in it (`shuffled:of=rredcot:candidates=answers`)."""

    def __post_init__(self) -> None:
        check(bool(self.of), "credit.of: name the method to shuffle (shuffled:of=<method>)")
        check_wrapped("shuffled", self.of, self.options)
        check(self.level in LEVELS, f"credit.level must be one of {LEVELS}, got {self.level!r}")
        check_segmenter_option(self.segmenter)


def _resample(source: torch.Tensor, length: int) -> torch.Tensor:
    """source[L_s] -> [length] by nearest index (the identity when the lengths agree)."""
    index = ((torch.arange(length, dtype=torch.float64) + 0.5) * len(source) / length).long().clamp(max=len(source) - 1)
    return source[index]


def permute_segments(values: torch.Tensor, bounds: list[list[tuple[int, int]]], orders: list[torch.Tensor],
                     keep_sign: bool) -> torch.Tensor:
    """values[B, T] -> [B, T] with segment j of row b taking segment orders[b][j]'s tokens (see module
    docstring). keep_sign=False shifts to the source mean (advantages); True rescales to it (weights)."""
    out = values.clone()
    for row, (row_bounds, order) in enumerate(zip(bounds, orders)):
        for target, source in enumerate(order.tolist()):
            if source == target:
                continue
            (a, b), (c, d) = row_bounds[target], row_bounds[source]
            src = values[row, c:d]
            moved = _resample(src, b - a)
            if keep_sign and float(moved.mean()) != 0.0:
                out[row, a:b] = moved * (src.mean() / moved.mean())
            elif keep_sign:  # the resampled tokens all hit zeros of the source: spread its mean evenly
                out[row, a:b] = src.mean()
            else:
                out[row, a:b] = moved - moved.mean() + src.mean()
    return out


def permutations(bounds: list[list[tuple[int, int]]], rollouts: Rollouts, seed: int) -> list[torch.Tensor]:
    """One seeded uniform permutation of each row's segment indices."""
    return row_permutations([len(b) for b in bounds], rollouts, seed)


def row_permutations(sizes: list[int], rollouts: Rollouts, seed: int) -> list[torch.Tensor]:
    """One seeded uniform permutation of range(sizes[b]) per row b (the seed combined with a digest of the batch)."""
    digest = zlib.crc32(rollouts.completion_ids.cpu().numpy().tobytes())
    generator = torch.Generator().manual_seed(seed * 1_000_003 + digest)
    return [torch.randperm(n, generator=generator) for n in sizes]


@register("shuffled",
          "control: a method's own segment credit permuted among each trace's segments (shuffled:of=<method>; "
          "level=token: over its tokens)",
          ShuffledConfig, needs_segments=True, privileged=wrapped_privileged)
def shuffled(rollouts: Rollouts, probe: Any, config: ShuffledConfig) -> Credit:
    credit, inner_config = wrapped_credit(config.of, config.options, rollouts, probe)  # its cost is counted inside
    if config.level == "token":
        return shuffle_tokens(credit, rollouts, config.seed)
    segmenter = config.segmenter or getattr(inner_config, "segmenter", "")
    bounds = segment_bounds(segments_for(rollouts, probe, segmenter))
    orders = permutations(bounds, rollouts, config.seed)
    mask = rollouts.trainable_mask().to(credit.advantages.dtype)
    advantages = permute_segments(credit.advantages, bounds, orders, keep_sign=False) * mask
    weights = None if credit.weights is None else permute_segments(credit.weights, bounds, orders, keep_sign=True)
    return Credit(advantages=advantages, weights=weights, loss_mask=credit.loss_mask, cost=credit.cost,
                  info={**credit.info, "shuffled_fixed_points": _fixed_point_share(orders)})


def shuffle_tokens(credit: Credit, rollouts: Rollouts, seed: int) -> Credit:
    """`credit` with each row's advantages[B, T] and weights[B, T] permuted together over the row's trainable
    tokens (one seeded uniform permutation per row)."""
    mask = rollouts.trainable_mask()
    advantages = credit.advantages * mask.to(credit.advantages.dtype)
    weights = credit.weights
    orders = row_permutations([int(n) for n in mask.sum(1).tolist()], rollouts, seed)
    shuffled_adv = advantages.clone()
    shuffled_w = None if weights is None else weights.clone()
    for row, order in enumerate(orders):
        where = mask[row].nonzero().flatten()
        shuffled_adv[row, where] = advantages[row, where[order]]
        if shuffled_w is not None:
            shuffled_w[row, where] = weights[row, where[order]]
    return Credit(advantages=shuffled_adv, weights=shuffled_w, loss_mask=credit.loss_mask, cost=credit.cost,
                  info={**credit.info, "shuffled_fixed_points": _fixed_point_share(orders)})


def _fixed_point_share(orders: list[torch.Tensor]) -> float:
    total = sum(len(o) for o in orders)
    return sum(int((o == torch.arange(len(o))).sum()) for o in orders) / max(total, 1)
