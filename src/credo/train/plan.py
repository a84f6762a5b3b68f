"""A run's plan: what its settings name, resolved once, when the run is set up (config: a
credo.train.config.TrainConfig).

`TrainConfig` holds settings only (the method's name, the estimator's options as a mapping, the strategy's name
and options). `make_plan` looks them up in the registries: the estimator the method resolves to, its frozen
config (options checked, errors naming `train.credit.<field>`), and the rollout strategy with its config. The
trainer takes the plan; it never consults a registry itself.
"""

from __future__ import annotations

from dataclasses import dataclass, is_dataclass, replace
from typing import Any

from credo.core.config import check, to_dict
from credo.credit.compose import recorded_options
from credo.credit.registry import EstimatorSpec
from credo.strategies import STRATEGIES
from credo.strategies import make as make_strategy
from credo.strategies.base import RegisteredStrategy
from credo.train import methods


@dataclass(frozen=True)
class Plan:
    """estimator: the registered estimator `config.method` resolves to; credit: its frozen config;
    strategy: the rollout strategy bound to its config."""

    estimator: EstimatorSpec
    credit: Any
    strategy: RegisteredStrategy

    @property
    def segments_batch(self) -> bool:
        """Whether the step cuts the batch into segments before credit (credo.credit.registry.EstimatorSpec)."""
        return self.estimator.reads_batch_segments(self.credit)


def make_plan(config: Any) -> Plan:
    """`config`'s plan: its estimator and credit config, and its strategy (credo.strategies.make)."""
    estimator = methods.estimator_of(config.method, "train.method")
    options = to_dict(config.credit) if is_dataclass(config.credit) else config.credit
    check(isinstance(options, dict), f"train.credit must be a mapping of {estimator.name}'s options, got {options!r}")
    credit = estimator.make_config(options, prefix="train.credit.")
    check(config.strategy in STRATEGIES.names(),
          f"train.strategy must be one of {tuple(STRATEGIES.names())}, got {config.strategy!r}")
    return Plan(estimator, credit, make_strategy(config.strategy, strategy_options(config)))


def strategy_options(config: Any) -> Any:
    """The run's strategy config, from the TrainConfig fields that hold it."""
    if config.strategy == "resets":
        return config.reset
    if config.strategy == "dynamic":
        return {"max_rounds": config.dynamic_max_rounds}
    return None


def with_plan(config: Any) -> tuple[Any, Plan]:
    """(config with `credit` as the estimator's complete options, every default filled in, its plan): what
    config.yaml records, so that a run's file names every option its estimator ran with."""
    plan = make_plan(config)
    return replace(config, credit=recorded_options(plan.credit)), plan
