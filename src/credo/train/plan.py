"""A run's plan: what its settings name, resolved once, when the run is set up.

`plan_run` is the one way from (a config file, the command's flags, `--set`) to a run: it loads the TrainConfig
(defaults <- the start's and the machine's <- the method's recipe <- YAML <- flags <- --set) and plans it.
`TrainConfig` holds settings only (the method's name, the estimator's options as a mapping, the strategy's name
and options). `make_plan` looks them up in the registries: the estimator the method resolves to, its frozen
config (options checked, errors naming `train.credit.<field>`), and the rollout strategy with its config. The
trainer, `--help-config` and a resume take the plan; none consults a registry itself.
"""

from __future__ import annotations

from dataclasses import dataclass, is_dataclass, replace
from typing import Any

from credo import credit
from credo.core.config import check, merge, to_dict, user_settings
from credo.credit.compose import recorded_options
from credo.credit.registry import EstimatorSpec
from credo.strategies import STRATEGIES
from credo.strategies import make as make_strategy
from credo.strategies.base import RegisteredStrategy
from credo.train import methods
from credo.train.config import TrainConfig, machine_defaults, train_config_from_dict


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


def make_plan(config: TrainConfig, recipe: methods.Recipe | None = None) -> Plan:
    """`config`'s plan: its estimator and credit config, and its strategy (credo.strategies.make) with the options
    the strategy's registry entry finds in `config`. `recipe`: what config.method resolves to, when the caller
    resolved it already (plan_run)."""
    recipe = recipe or methods.recipe_of(config.method, "train.method")
    estimator = credit.get(recipe.estimator, "train.method")
    options = to_dict(config.credit) if is_dataclass(config.credit) else config.credit
    check(isinstance(options, dict), f"train.credit must be a mapping of {estimator.name}'s options, got {options!r}")
    credit_config = estimator.make_config(options, prefix="train.credit.")
    check(config.strategy in STRATEGIES.names(),
          f"train.strategy must be one of {tuple(STRATEGIES.names())}, got {config.strategy!r}")
    settings = STRATEGIES.get(config.strategy).settings
    return Plan(estimator, credit_config, make_strategy(config.strategy, settings(config) if settings else None))


def with_plan(config: TrainConfig, recipe: methods.Recipe | None = None) -> tuple[TrainConfig, Plan]:
    """(config with `credit` as the estimator's complete options, every default filled in, its plan): what
    config.yaml records, so that a run's file names every option its estimator ran with (`recipe`: see make_plan)."""
    plan = make_plan(config, recipe)
    return replace(config, credit=recorded_options(plan.credit)), plan


def plan_run(path: str | None = None, overrides: list[str] | None = None, extra: dict[str, Any] | None = None,
             base: dict[str, Any] | None = None) -> tuple[TrainConfig, Plan]:
    """(the run's config, its plan). The config: defaults <- `machine_defaults` (a Hugging Face start; its sizes on
    a CPU) <- `base` <- method recipe <- YAML at `path` <- `extra` (the CLI's shortcut flags) <- `overrides`
    (--set); its `credit` holds every option of the estimator, defaults filled in (what config.yaml records).
    The recipe is that of the method the user names (in the file, `extra` or the overrides); `base` holds
    settings a recipe may override (a comparison's shared schedule)."""
    user = user_settings(path, overrides, extra)
    recipe = methods.recipe_of(str(user.get("method", TrainConfig.method)))
    sized = machine_defaults(str(user.get("start", TrainConfig.start)))
    return with_plan(train_config_from_dict(merge(merge(merge(sized, base or {}), recipe.defaults), user)), recipe)


def load_train_config(path: str | None = None, overrides: list[str] | None = None,
                      extra: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> TrainConfig:
    """plan_run's config alone, for what reads a run's settings without running it (a comparison's records)."""
    return plan_run(path, overrides, extra, base)[0]
