"""Every command is configured the same way (frozen dataclass, --config YAML, shortcut flags, --set,
--help-config), and TrainConfig holds typed, documented fields."""

from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from credo.cli.main import main
from credo.core.config import ConfigError, describe, field_docs
from credo.train.config import TrainConfig, config_from_run
from credo.train.plan import load_train_config

# command -> (config class, a field, its value in the YAML file, a flag naming it, the flag's value, --set value)
COMMANDS = {
    "train": ("TrainConfig", "seed", 3, "--seed", "4", 5),
    "sft": ("SFTConfig", "max_steps", 30, None, None, 40),
    "eval": ("EvalConfig", "n", 30, "--n", "40", 50),
    "audit": ("AuditConfig", "n", 32, "--n", "48", 64),
    "compare": ("CompareConfig", "budget", 3000, "--budget", "4000", 5000),
    "show": ("ShowConfig", "n", 3, "--n", "4", 5),
}


def help_config(capsys, argv: list[str]) -> dict[str, str]:
    """{dotted path: value text} from `credo <argv> --help-config`."""
    capsys.readouterr()
    assert main([*argv, "--help-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return {line.split(" = ", 1)[0]: line.split(" = ", 1)[1] for line in lines if " = " in line
            and not line.startswith(" ")}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_yaml_then_flags_then_set(command, tmp_path, capsys):
    name, field, in_yaml, flag, flag_value, set_value = COMMANDS[command]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({field: in_yaml}))
    capsys.readouterr()
    assert main([command, "--help-config"]) == 0
    assert capsys.readouterr().out.startswith(f"credo {command}: {name} ")
    assert help_config(capsys, [command, "--config", str(path)])[field] == str(in_yaml)
    if flag:
        assert help_config(capsys, [command, "--config", str(path), flag, flag_value])[field] == flag_value
    given = [command, "--config", str(path), *([flag, flag_value] if flag else []), "--set", f"{field}={set_value}"]
    assert help_config(capsys, given)[field] == str(set_value)


def test_train_help_config_lists_every_field_with_its_doc_and_default(capsys):
    capsys.readouterr()
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    rows = describe(TrainConfig())
    assert len(rows) > 40
    assert "\ncredit.std = \"sample\"\n" in out  # the mapping `credit` is listed as the estimator's fields
    for path, value, doc in rows:
        if path == "credit":  # a mapping in the config: listed as the estimator's fields (above)
            continue
        assert f"\n{path} = " in out, path
        assert doc, f"{path} has no docstring"
        assert doc.split()[0] in out.split(f"\n{path} = ", 1)[1].split("\n", 2)[1], path
    assert "\nloss.eps_low = 0.2\n    Lower clip range" in out
    assert "\nsampling.max_new_tokens = 96\n" in out and "\nreset.localiser = \"random\"\n" in out


def test_train_help_config_shows_the_recipe_and_its_estimator_options(capsys):
    listed = help_config(capsys, ["train", "--method", "rredcot", "--set", "credit.lam=0.25"])
    assert listed["credit.lam"] == "0.25" and "credit.center" in listed and "credit.std" not in listed
    listed = help_config(capsys, ["train", "--method", "dapo"])
    assert listed["loss.eps_high"] == "0.28" and listed["strategy"] == '"dynamic"'


def test_field_docs_reads_the_string_under_each_field():
    from credo.lab.audit.config import AuditConfig
    from credo.lab.compare.config import CompareConfig
    from credo.lab.compare.presets import Preset
    from credo.train.evaluate import EvalConfig
    from credo.train.sft_config import SFTConfig
    from credo.lab.show.view import ShowConfig
    assert field_docs(TrainConfig)["lr"] == "AdamW learning rate."
    default = TrainConfig()
    documented = (TrainConfig, SFTConfig, EvalConfig, AuditConfig, CompareConfig, ShowConfig, Preset,
                  type(default.loss), type(default.reset), type(default.sampling))
    for cls in documented:  # every field of every command's config (and its sections) has its own doc
        assert set(field_docs(cls)) == {f.name for f in dataclasses.fields(cls)}, cls.__name__


def test_every_estimator_option_has_its_own_doc_inherited_ones_included():
    from credo import credit
    from credo.credit.outcome import GRPOConfig
    for name in credit.names():
        cls = credit.get(name).config_cls
        assert set(field_docs(cls)) == {f.name for f in dataclasses.fields(cls)}, name
    assert field_docs(GRPOConfig)["std"].startswith("The group std")  # from GroupNormConfig


def test_the_config_holds_the_credit_options_as_data_and_the_plan_resolves_them_once():
    from credo.core.config import to_dict
    from credo.credit.outcome import GRPOConfig
    from credo.credit.rredcot import RREDCoTConfig
    from credo.train.plan import make_plan
    config = load_train_config(None, ["method=rredcot", "credit.lam=0.25"])
    assert config.credit == to_dict(RREDCoTConfig(lam=0.25))  # every option, defaults filled in: config.yaml's record
    plan = make_plan(config)
    assert plan.credit == RREDCoTConfig(lam=0.25) and plan.estimator.name == "rredcot" and plan.strategy.name == "plain"
    srpo = make_plan(load_train_config(None, ["method=srpo"]))
    assert (srpo.estimator.name == "grpo" and srpo.credit == GRPOConfig(std="population")
            and srpo.strategy.name == "resets")
    assert make_plan(TrainConfig(method="rloo")).estimator.name == "rloo"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.credit.lam = 1.0
    with pytest.raises(ConfigError, match=r"^unknown config field 'train\.credit\.lam_typo'"):
        load_train_config(None, ["method=rredcot", "credit.lam_typo=1"])


def test_sampling_is_a_section_and_recorded_runs_with_top_level_keys_still_load(tmp_path):
    config = load_train_config(None, ["sampling.max_new_tokens=20", "sampling.top_p=0.9"])
    assert (config.sampling.max_new_tokens, config.sampling.top_p, config.sampling.temperature) == (20, 0.9, 1.0)
    with pytest.raises(ConfigError, match=r"^unknown config field 'train\.top_p'"):
        load_train_config(None, ["top_p=0.5"])
    with pytest.raises(ConfigError, match=r"^train\.sampling\.top_p must be in \(0, 1\]"):
        load_train_config(None, ["sampling.top_p=0"])
    # a run directory written before `sampling` was a section still loads (and resumes)
    run = tmp_path / "old-run"
    run.mkdir()
    (run / "config.yaml").write_text("method: rredcot\ncredit: {}\ntemperature: 0.7\nmax_new_tokens: 24\nseed: 0\n")
    old = config_from_run(str(run))
    assert old.sampling.temperature == 0.7 and old.sampling.max_new_tokens == 24


def test_an_unknown_flag_is_refused_before_anything_is_written(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:  # argparse's own refusal: usage, then the error line
        main(["train", "--model", "smollm2-135m", "--out", str(tmp_path / "r"), "--quiet"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().endswith("error: unrecognized arguments: --model smollm2-135m")
    assert not os.path.exists(tmp_path / "r")


def test_audit_set_is_not_overwritten_by_flag_defaults(capsys):
    # before: `--set n=16` was silently replaced by --n's default 256
    assert help_config(capsys, ["audit", "--set", "n=16", "--set", "group_size=4"])["n"] == "16"


def test_eval_set_of_a_task_option_names_its_new_path(capsys):
    assert main(["eval", "--set", "digits=3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "task_options.digits" in err and len(err.strip().splitlines()) == 1
    assert help_config(capsys, ["eval", "--set", "task_options.digits=3"])["task_options"] == '{"digits": 3}'


def test_every_command_needs_out_unless_it_lists_its_config(capsys):
    for command in ("sft", "audit", "compare", "show"):
        assert main([command, "--quiet"]) == 2
        assert capsys.readouterr().err.strip() == f"credo {command}: error: --out DIR is required"


def test_a_check_inside_a_fields_value_names_the_full_path():
    # the segmenter check says 'segmenter.name'; its user sets it under credit. or reset.
    with pytest.raises(ConfigError, match=r"^train\.credit\.segmenter\.name must be one of"):
        load_train_config(None, ["method=rredcot", "credit.segmenter=nope"])
    with pytest.raises(ConfigError, match=r"^train\.reset\.segmenter\.name must be one of"):
        load_train_config(None, ["reset.segmenter=nope"])
    with pytest.raises(ConfigError, match=r"^train\.loss\.eps_low must be in \[0, 1\)"):
        load_train_config(None, ["loss.eps_low=3"])


@pytest.mark.parametrize("argv, expect", [
    (["compare", "--methods", "nope"], "credo compare: error: compare --methods: unknown method 'nope'"),
    (["compare", "--methods", "vineppo:k"], "credo compare: error: compare --methods: method 'vineppo:k': option 'k'"),
    (["show", "--methods", "nope"], "credo show: error: show --methods: unknown credit estimator 'nope'"),
    (["show", "--methods", "vineppo:k=0"], "credo show: error: show --methods vineppo:k must be > 0, got 0"),
])
def test_an_unknown_method_is_one_line_before_out_is_touched(argv, expect, tmp_path, capsys):
    # before: a KeyError traceback, and `show` had already claimed --out
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expect) and len(err.splitlines()) == 1
    assert not out.exists()


def test_eval_reads_the_split_it_is_asked_for(monkeypatch, capsys, tmp_path):
    """--split validation evaluates on the task's validation problems (disjoint from the held-out ones); a task
    without a validation split is one line naming it."""
    import json
    import credo.train.evaluate as evaluate_module
    from credo.tasks import make_task
    from credo.train.evaluate import EvalResult
    seen = []
    monkeypatch.setattr(evaluate_module, "evaluate", lambda policy, task, problems, **kw: seen.append(
        [p.prompt for p in problems]) or EvalResult(accuracy=0.5, n=len(problems)))
    assert main(["eval", "--split", "validation", "--n", "6", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["split"] == "validation"
    assert main(["eval", "--n", "6", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["split"] == "heldout"
    task = make_task("arith")
    assert seen == [[p.prompt for p in task.validation_problems(6)], [p.prompt for p in task.heldout_problems(6)]]
    assert not set(seen[0]) & {p.prompt for p in task.heldout_problems(1000)}
    data = tmp_path / "t.jsonl"
    data.write_text("".join(f'{{"question": "{i}+1?", "answer": "{i + 1}"}}\n' for i in range(40)))
    capsys.readouterr()
    assert main(["eval", "--task", f"jsonl:{data}", "--split", "validation", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--split validation needs a task with a validation split" in err[0]
