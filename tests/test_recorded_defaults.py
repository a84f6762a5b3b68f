"""A default that changed does not relabel the runs recorded under the old one: a record that leaves an option out
was written while the old default held (credo.train.config.DEFAULTS_OF_THEIR_TIME), and since then every run
records every option of its estimator and of each estimator it wraps."""

import yaml

from credo import credit
from credo.core.config import to_dict
from credo.train.config import as_recorded, config_from_run
from credo.train.plan import load_train_config
from credo.train.resume_checks import config_changes


def _record(tmp_path, method, credit_options, name="run"):
    """A run directory whose config.yaml records `method` with exactly `credit_options` (as an older credo wrote
    them: only what was set)."""
    run = tmp_path / name
    run.mkdir()
    tree = to_dict(load_train_config(overrides=["steps=2", "method=grpo"]))
    tree.update(method=method, credit=credit_options)
    (run / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    return str(run)


def test_the_defaults_follow_the_measurements():
    assert credit.get("ibpo").make_config({}).preserve_mass is False  # the paper's raw totals
    assert credit.get("gtpo").make_config({}).form == "paper"  # the paper's shaped rewards


def test_a_record_without_the_option_keeps_the_default_of_its_time(tmp_path):
    assert config_from_run(_record(tmp_path, "ibpo", {}, "a")).credit["preserve_mass"] is True
    assert config_from_run(_record(tmp_path, "ibpo", {"preserve_mass": False}, "b")).credit["preserve_mass"] is False
    assert config_from_run(_record(tmp_path, "gtpo", {"a2": 0.1}, "c")).credit["form"] == "weights"
    wrapped = config_from_run(_record(tmp_path, "shuffled", {"of": "ibpo"}, "d")).credit
    assert wrapped["options"]["preserve_mass"] is True
    nested = as_recorded("shuffled", {"of": "tempo", "options": {"of": "gtpo"}})
    assert nested["options"]["options"] == {"form": "weights"}
    assert as_recorded("grpo", {}) == {}  # nothing changed there: nothing filled


def test_a_new_run_records_every_option_of_every_level():
    config = load_train_config(overrides=["method=shuffled:of=tempo:options.of=ibpo", "steps=2"])
    tempo = config.credit["options"]
    assert tempo["of"] == "ibpo" and tempo["options"]["preserve_mass"] is False
    assert set(tempo["options"]) == set(credit.get("ibpo").make_config({}).__dataclass_fields__)
    assert "lam" in tempo  # the wrapper's own options too
    again = as_recorded(config.method, config.credit)  # read back: nothing left to fill
    assert again == config.credit


def test_a_checkpoint_of_the_old_default_does_not_resume_under_the_new_one(tmp_path):
    saved = {"method": "ibpo", "credit": {}, "steps": 2}  # a checkpoint written when mass was kept by default
    now = load_train_config(overrides=["method=ibpo", "steps=2"])
    assert "train.credit.preserve_mass: checkpoint True, now False" in config_changes(saved, now)
    same = load_train_config(overrides=["method=ibpo:preserve_mass=true", "steps=2"])
    assert not [c for c in config_changes(saved, same) if "credit" in c]


def test_an_unknown_method_is_left_as_recorded():
    assert as_recorded("nonesuch", {"x": 1}) == {"x": 1}  # the config check names it, not this
