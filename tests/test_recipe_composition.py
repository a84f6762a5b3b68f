"""A baseline recipe on another estimator's credit: `dapo:of=<estimator>` trains that estimator's advantages with
DAPO's clip-higher, token-mean loss, dynamic sampling and overlong penalty, and reads as that credit everywhere a
method is looked up (its privilege, its audit row, the goals' credit methods, a comparison's run config)."""

from __future__ import annotations

import pytest

from builders import TRAIN_FAST, strip_time
from credo.core.config import ConfigError
from credo.train import methods
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer

SPEC = "dapo:of=rredcot:options.include_reference=false"


def test_a_composed_recipe_is_the_recipes_settings_on_the_estimators_credit():
    dapo = load_train_config(None, ["method=dapo", "start=s"])
    composed = load_train_config(None, [f"method={SPEC}", "start=s"])
    for field in ("strategy", "overlong_buffer", "overlong_fit_task"):
        assert getattr(composed, field) == getattr(dapo, field), field
    assert (composed.loss.eps_high, composed.loss.aggregation) == (0.28, "token-mean") == (
        dapo.loss.eps_high, dapo.loss.aggregation)
    assert composed.credit["include_reference"] is False and "include_reference" not in dapo.credit
    assert methods.estimator_of(SPEC).name == "rredcot" and methods.estimator_of("dapo").name == "grpo"
    assert methods.credit_spec(SPEC) == "rredcot:include_reference=false"
    assert methods.credit_spec("dapo") == "grpo"
    # privilege follows the credit: rredcot with the reference tail reads the reference solution
    assert methods.privileged("dapo:of=rredcot") and not methods.privileged(SPEC)
    nested = methods.resolve("dapo:of=tempo:options.of=rredcot:options.include_reference=false")
    assert nested.estimator == "tempo" and nested.defaults["credit"] == methods.resolve(
        "tempo:of=rredcot:include_reference=false").defaults["credit"]


@pytest.mark.parametrize("spec, words", [
    ("dapo:of=srpo", "must name an estimator"),
    ("dapo:of=nothing", "must name an estimator"),
    ("dapo:of=rredcot:include_reference=false", "options.<key>=<value>"),
    ("rrpo:of=rredcot", "rrpo does not take of="),
])
def test_a_composition_that_cannot_run_is_one_line_naming_the_field(spec, words):
    with pytest.raises(ConfigError) as err:
        load_train_config(None, [f"method={spec}", "start=s"])
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_composed_run_trains_the_estimators_credit_under_dapo(saved_policy, tmp_path):
    """Two steps of dapo:of=rredcot:... differ from dapo's own (rredcot's advantages), and repeat exactly."""
    logs = {}
    for name, method in (("dapo", "dapo"), ("a", SPEC), ("b", SPEC)):
        config = load_train_config(None, [f"method={method}", f"start={saved_policy}", "steps=2", *TRAIN_FAST])
        trainer = Trainer(config, str(tmp_path / name), progress=False)
        trainer.train()
        logs[name] = strip_time(trainer.log.rows())
    assert logs["a"] == logs["b"]
    assert logs["a"] != logs["dapo"]
    recorded = (tmp_path / "a" / "config.yaml").read_text()
    assert f"method: {SPEC}" in recorded and "include_reference: false" in recorded
    assert set(logs["a"][0]) >= set(logs["dapo"][0])  # every DAPO metric (e.g. its discarded groups) is kept


def test_a_comparison_counts_a_composed_recipe_as_credit_and_runs_it_under_its_full_name():
    from credo.lab.compare.goals import credit_methods
    from credo.lab.compare.presets import PRESETS, run_config
    grid = PRESETS["dapo-credit"]
    assert credit_methods(grid.methods) == [m for m in grid.methods if m not in ("grpo", "dapo")]
    config = run_config(SPEC, 0, grid, "start")
    assert config.method == SPEC and config.strategy == "dynamic" and config.credit["include_reference"] is False
