"""The credit estimators, entries of the one registry class (credo.core.registry), found by name:
`credo.credit.get("grpo")`.

An estimator is a function `(rollouts, probe, config) -> Credit`. `config` is an instance of the
estimator's own frozen dataclass (its knobs, documented field by field); `probe` is the only door
to the model (None is fine for estimators that need rewards only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from credo.core.config import ConfigError, UserError, from_dict
from credo.core.registry import Entry, Registry


@dataclass(frozen=True)
class NoConfig:
    """This estimator has no knobs."""


@dataclass(frozen=True)
class EstimatorSpec(Entry):
    """A registered estimator (an Entry of ESTIMATORS).

    uses_model: it needs a Probe.
    needs_segments: it reads segments (a bool, or a function of its config where only some settings read them,
    e.g. `tempo:at=segments`); unless its config names a `segmenter` of its own (reads_batch_segments), those of
    the batch (`rollouts.segment_ids`), which the trainer's segmentation stage fills once per step
    (credo.core.segment.with_segments; a batch given without them is cut by the task's default segmenter when the
    estimator asks, credo.core.segment.segments_for).
    privileged: it reads what a deployed trainer would not have, the task's reference solution, its step labels
    or its gold answer beyond the reward: a bool, or a function of the estimator's config (e.g. RREDCoT reads the
    reference solution only with `include_reference`); see `reads_privileged`."""

    uses_model: bool = False
    needs_segments: bool | Callable[[Any], bool] = False

    def reads_privileged(self, config: Any = None) -> bool:
        """Whether this estimator, configured by `config` (default: its defaults), reads privileged task data."""
        if callable(self.privileged):
            return bool(self.privileged(config if config is not None else self.make_config()))
        return bool(self.privileged)

    def probes_model(self, config: Any = None) -> bool:
        """Whether this estimator, configured by `config`, needs a Probe: it uses the model, or it wraps one
        that does (`of=<method>`, credo.credit.compose)."""
        if self.uses_model:
            return True
        inner = wrapped(config)
        return inner is not None and inner[0].probes_model(inner[1])

    def reads_batch_segments(self, config: Any) -> bool:
        """Whether this estimator, configured by `config`, reads the batch's own segments (it needs segments
        and names no `segmenter` of its own): the trainer then cuts them before credit."""
        needs = self.needs_segments(config) if callable(self.needs_segments) else self.needs_segments
        if needs and getattr(config, "segmenter", "") == "":
            return True
        inner = wrapped(config)  # a wrapper reads them when what it wraps does (`tempo:of=rredcot`)
        return inner is not None and inner[0].reads_batch_segments(inner[1])

    def make_config(self, values: Any = None, prefix: str = "credit.") -> Any:
        """The estimator's frozen config from a mapping of options (an instance of it is returned as is)."""
        if isinstance(values, self.config_cls):
            return values
        values = dict(values or {})
        route = getattr(self.config_cls, "route_options", None)  # a wrapper's (credo.credit.compose.Wrapping)
        return from_dict(self.config_cls, route(values) if route else values, prefix=prefix)

    def __call__(self, rollouts: Any, probe: Any = None, config: Any = None) -> Any:
        """Run the estimator; its Credit's cost is what it spent through `probe` (metered here)."""
        config = config if config is not None else self.make_config()
        if probe is None and self.probes_model(config):
            raise ValueError(f"estimator {self.name!r} uses the model: pass a Probe")
        check_rewards(rollouts)
        rollouts = padding_segments_cleared(rollouts)
        if probe is None:
            return self.fn(rollouts, probe, config)
        with probe.metered() as spent:  # everything the call spends, a wrapped estimator's work included
            result = self.fn(rollouts, probe, config)
        result.cost = spent
        return result


MAX_REWARD = 1e100
"""The largest reward magnitude an estimator takes: group statistics square deviations, which past ~1e150 are
inf even in float64 (credo.core.groups computes them there above 1e17)."""


class NonFiniteReward(UserError):
    """A reward is NaN or infinite; the message names the row."""


def check_rewards(rollouts: Any) -> None:
    """Every estimator's input passes here: a NaN/inf reward would spread through group means into every
    advantage (or silently zero a group), so it stops the run, naming the first bad row."""
    rewards = rollouts.rewards
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    huge = (rewards.abs() > MAX_REWARD).nonzero().flatten().tolist() if not bad else []
    if bad or huge:
        row = (bad or huge)[0]
        problems = getattr(rollouts, "problems", None) or []
        about = f" (problem {problems[row].key!r})" if row < len(problems) and hasattr(problems[row], "key") else ""
        what = ("are not finite: the task's reward function must return finite numbers" if bad else
                f"exceed {MAX_REWARD:g} in magnitude, where group statistics lose their meaning: rescale them")
        raise NonFiniteReward(f"reward of row {row}{about} is {float(rewards[row])}; {len(bad or huge)} of "
                              f"{rewards.numel()} rewards {what}")


def padding_segments_cleared(rollouts: Any) -> Any:
    """rollouts with segment_ids[B, T] set to -1 wherever completion_mask is False (itself when they are already):
    estimators index segments by id, so a segment id an integration left on padding would otherwise give padding
    a segment's credit, or index past a row's segments."""
    ids = getattr(rollouts, "segment_ids", None)
    if ids is None:
        return rollouts
    padding = ~rollouts.completion_mask.to(ids.device)
    if not bool(((ids != -1) & padding).any()):
        return rollouts
    return rollouts.with_fields(segment_ids=ids.masked_fill(padding, -1))


ESTIMATORS = Registry("credit estimator")
"""Every registered estimator, by name (an EstimatorSpec each)."""


def register(name: str, description: str, config_cls: type = NoConfig, *, uses_model: bool = False,
             needs_segments: bool | Callable[[Any], bool] = False,
             privileged: bool | Callable[[Any], bool] = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register `fn(rollouts, probe, config) -> Credit` under `name` (`privileged`: see EstimatorSpec)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        ESTIMATORS.add(EstimatorSpec(name, fn, config_cls, description, privileged, uses_model=uses_model,
                                     needs_segments=needs_segments))
        return fn

    return wrap


def get(name: str, field: str = "") -> EstimatorSpec:
    """The estimator registered as `name`; an unknown name is one ConfigError (after `field`, when given)."""
    return ESTIMATORS.get(name, field)


def names() -> list[str]:
    return ESTIMATORS.names()


def wrapped(config: Any) -> tuple[EstimatorSpec, Any] | None:
    """(the estimator a wrapper's `config` wraps, its config) for a wrapper with `of=<method>`
    (credo.credit.compose); None for any other config."""
    name = getattr(config, "of", "")
    if not name:
        return None
    inner = get(name)
    return inner, inner.make_config(getattr(config, "options", {}))


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'shuffled:of=rredcot:seed=1' -> ('shuffled', {'of': 'rredcot', 'seed': '1'}) (values stay strings;
    the estimator's config class converts and checks them)."""
    name, *items = spec.split(":")
    options = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"method {spec!r}: option {item!r} must look like key=value")
        key, value = item.split("=", 1)
        if key in options:  # the later one would silently win: `shuffled:of=tempo:of=rredcot` shuffles rredcot
            raise ConfigError(f"method {spec!r}: option {key!r} is given twice (the method a wrapped method wraps "
                             f"is options.of=..., its options options.<key>=...)")
        options[key] = value
    return name, options
