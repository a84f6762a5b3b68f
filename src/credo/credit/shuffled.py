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
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from credo.config import check
from credo.credit.registry import get, register
from credo.rollouts import Credit, Rollouts
from credo.segment import check_segmenter_option, segment_bounds, segments_for


@dataclass(frozen=True)
class ShuffledConfig:
    """of: the wrapped estimator. seed: of the permutations (combined with a digest of the batch, so
    every batch gets its own permutations and the same batch always the same). segmenter: '' = the
    wrapped method's own (the batch's segments when it has none). options: the wrapped method's options; any key
    not named here lands in it (`shuffled:of=rredcot:candidates=answers`)."""

    EXTRA_OPTIONS_FIELD = "options"

    of: str = "grpo"
    seed: int = 0
    segmenter: Any = ""
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self.of != "shuffled", "credit.of: shuffled cannot wrap itself")
        try:
            inner = get(self.of)
        except KeyError as err:
            raise ValueError(f"credit.of: {err.args[0]}") from None
        inner.make_config(self.options)  # the wrapped method's options are checked now, naming the field
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
    digest = zlib.crc32(rollouts.completion_ids.cpu().numpy().tobytes())
    generator = torch.Generator().manual_seed(seed * 1_000_003 + digest)
    return [torch.randperm(len(b), generator=generator) for b in bounds]


def wrapped_privileged(config: ShuffledConfig) -> bool:
    """Privileged when the method it wraps is (credo.credit.registry.EstimatorSpec)."""
    inner = get(config.of)
    return inner.reads_privileged(inner.make_config(config.options))


@register("shuffled", "control: a method's own segment credit permuted among each trace's segments (shuffled:of=<method>)",
          ShuffledConfig, needs_segments=True, privileged=wrapped_privileged)
def shuffled(rollouts: Rollouts, probe: Any, config: ShuffledConfig) -> Credit:
    inner = get(config.of)
    inner_config = inner.make_config(config.options)
    credit = inner(rollouts, probe, inner_config)  # its cost is counted inside
    segmenter = config.segmenter or getattr(inner_config, "segmenter", "")
    bounds = segment_bounds(segments_for(rollouts, probe, segmenter))
    orders = permutations(bounds, rollouts, config.seed)
    mask = rollouts.trainable_mask().to(credit.advantages.dtype)
    advantages = permute_segments(credit.advantages, bounds, orders, keep_sign=False) * mask
    weights = None if credit.weights is None else permute_segments(credit.weights, bounds, orders, keep_sign=True)
    return Credit(advantages=advantages, weights=weights, loss_mask=credit.loss_mask, cost=credit.cost,
                  info={**credit.info, "shuffled_fixed_points": _fixed_point_share(orders)})


def _fixed_point_share(orders: list[torch.Tensor]) -> float:
    total = sum(len(o) for o in orders)
    return sum(int((o == torch.arange(len(o))).sum()) for o in orders) / max(total, 1)
