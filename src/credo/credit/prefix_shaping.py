"""First-error prefix shaping (VPPO-style): a wrong trace's verified prefix keeps the group's positive credit.

Specification: docs/methods.md, "## First-error prefix shaping (VPPO-style)". With A_i GRPO's advantage and
A+_g the mean of the positive advantages in row i's group (0 when none is positive):
  a row that is wrong (verifier verdict) with A_i < 0: a localiser (credo.strategies.localisers: random,
      value, prompt, oracle, self or credit) names its first wrong step e; tokens of steps < e get
      prefix_credit * A+_g, tokens of step e and after keep A_i;
  every other row keeps A_i on every token; padding and masked tokens get 0.
Only wrong rows of mixed groups are localised (elsewhere nothing would change), in one localiser call.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from credo.core.config import check
from credo.strategies import localisers
from credo.core.groups import GroupNormConfig, grpo_advantages
from credo.credit.registry import get, parse_spec, register
from credo.core.probe import Probe
from credo.core.rollouts import Credit, Rollouts
from credo.core.segment import check_segmenter_option, segment_bounds, segments_for


@dataclass(frozen=True)
class PrefixShapingConfig(GroupNormConfig):
    """First-error prefix shaping (docs/methods.md, "## First-error prefix shaping (VPPO-style)")."""

    localiser: str = "value"
    """Who names a wrong trace's first wrong step: random, value, prompt, oracle, self or credit (`credo methods`)."""
    credit_method: str = "rredcot"
    """For localiser=credit: the estimator spec ('name' or 'name:key=value:...') whose most negative segment it
    picks."""
    prefix_credit: float = 1.0
    """The prefix's credit as a share of the group's positive advantage (0: the prefix is neither rewarded nor
    penalised)."""
    value_drop: float = 0.05
    """For localiser=value (or self falling back to it): the value drop that marks the first wrong step."""
    seed: int = 0
    """For localiser=random: combined with a digest of the batch, so steps differ and runs repeat."""
    segmenter: Any = ""
    """The steps: '' = the batch's segments (the task's own segmenter), or a segmenter of its own."""

    def __post_init__(self) -> None:
        super().__post_init__()  # std, eps
        names = localisers.LOCALISERS.names()
        check(self.localiser in names, f"credit.localiser must be one of {names}, got {self.localiser!r}")
        try:
            name, options = parse_spec(self.credit_method)
            get(name).make_config(options)
        except ValueError as err:
            raise ValueError(f"credit.credit_method: {err.args[0] if err.args else err}") from None
        check(name != "prefix_shaping", "credit.credit_method: prefix_shaping cannot localise for itself")
        check(0 <= self.prefix_credit <= 1, f"credit.prefix_credit must be in [0, 1], got {self.prefix_credit}")
        check(0 <= self.value_drop <= 1, f"credit.value_drop must be in [0, 1], got {self.value_drop}")
        check_segmenter_option(self.segmenter)


def localiser_privileged(config: PrefixShapingConfig) -> bool:
    """Privileged (credo.credit.registry.EstimatorSpec) exactly when its localiser is."""
    options = localisers.LocaliserOptions(credit_method=config.credit_method)
    return localisers.LOCALISERS.get(config.localiser).reads_privileged(options)


def positive_credit(advantages: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """advantages[B], group[B] -> A+[B]: the mean of the positive advantages of each row's group (0: none)."""
    _, inverse = torch.unique(group, return_inverse=True)
    positive = advantages.clamp(min=0)
    n = int(inverse.max()) + 1 if inverse.numel() else 0
    inverse = inverse.to(advantages.device)
    sums = torch.zeros(n, dtype=advantages.dtype, device=advantages.device).index_add_(0, inverse, positive)
    counts = torch.zeros_like(sums).index_add_(0, inverse, (advantages > 0).to(advantages.dtype))
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))[inverse]


def shape_prefixes(advantages: torch.Tensor, mask: torch.Tensor, starts: dict[int, int],
                   prefix_value: torch.Tensor) -> torch.Tensor:
    """advantages[B] (per row), mask[B, T], starts {row: first token of its first wrong step}, prefix_value[B]
    -> advantages[B, T]: prefix_value on each shaped row's tokens before its start, the row's own advantage
    elsewhere, 0 outside `mask`."""
    out = advantages[:, None].expand(mask.shape).clone()
    for row, start in starts.items():
        out[row, :start] = prefix_value[row]
    return out * mask.to(out.dtype)


@register("prefix_shaping", "VPPO-style first-error prefix shaping: a wrong trace's steps before its localised first "
          "error keep the group's positive credit, only the rest is penalised (localiser: random|value|prompt|"
          "oracle|self|credit)", PrefixShapingConfig, uses_model=True, needs_segments=True,
          privileged=localiser_privileged)
def prefix_shaping(rollouts: Rollouts, probe: Probe, config: PrefixShapingConfig) -> Credit:
    segment_ids = segments_for(rollouts, probe, config.segmenter)
    adv = grpo_advantages(rollouts.rewards.float(), rollouts.group, std=config.std, eps=config.eps)
    rows = [i for i in range(rollouts.batch_size) if not bool(rollouts.correct[i]) and float(adv[i]) < 0]
    starts: dict[int, int] = {}
    # called with no row to shape too: localise() decides which localisers still run then (the credit
    # localiser's estimator holds collectives every data-parallel shard must call)
    digest = zlib.crc32(rollouts.completion_ids.cpu().numpy().tobytes())
    picks = localisers.localise(config.localiser, rollouts, rows, probe, segment_ids,
                                random.Random(config.seed * 1_000_003 + digest), value_drop=config.value_drop,
                                credit_method=config.credit_method)
    bounds = segment_bounds(segment_ids) if picks else []
    for row, step in zip(rows, picks):
        if bounds[row]:
            starts[row] = bounds[row][min(step, len(bounds[row]) - 1)][0]
    prefix_value = config.prefix_credit * positive_credit(adv, rollouts.group)
    mask = rollouts.trainable_mask()
    adv, prefix_value = adv.to(mask.device), prefix_value.to(mask.device)  # verl's rows: rewards on the CPU
    advantages = shape_prefixes(adv, mask, starts, prefix_value)
    prefix_tokens = sum(int(mask[row, :start].sum()) for row, start in starts.items())
    return Credit(advantages=advantages, info={"shaped_rows": float(len(starts)),
                                               "prefix_token_share": prefix_tokens / max(int(mask.sum()), 1)})
