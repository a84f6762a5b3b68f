"""No lost files, and nothing silently wrong about a run directory: --out claims, --force, resume checks."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import yaml

from credo.cli.main import main
from credo.core.config import ConfigError, to_dict
from credo.policy import load_policy
from credo.train.step import TrainingDiverged
from credo.train.trainer import Trainer
from builders import TRUST_FAST_SET, killed_run, one_line_error, snapshot, train_config



def user_files(tmp_path):
    """A directory of someone's files that a careless --out could destroy."""
    folder = tmp_path / "mine"
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "thesis.tex").write_text("years of work")
    (folder / "metrics.jsonl").write_text('{"mine": 1}\n')
    (folder / "summary.json").write_text("{}")
    return str(folder)


@pytest.mark.parametrize("command", [
    ["train", "--method", "grpo", "--steps", "1"],
    ["sft"],
    ["audit", "--n", "4", "--group-size", "2", "--k-ref", "2"],
    ["compare", "--preset", "smoke"],
])
def test_a_foreign_non_empty_out_is_refused_untouched(tmp_path, capsys, saved_policy, command):
    out = user_files(tmp_path)
    before = snapshot(out)
    extra = ["--start", saved_policy] if command[0] in ("train", "compare") else []
    line = one_line_error(capsys, command + extra + ["--out", out, "--quiet"])
    assert out in line and "--force" in line and "nothing was touched" in line
    assert snapshot(out) == before


def test_force_replaces_and_sft_out_is_atomic(tmp_path, capsys, saved_policy):
    out = user_files(tmp_path)  # not credo's: --force refuses it, untouched
    before = snapshot(out)
    line = one_line_error(capsys, ["train", "--method", "grpo", "--steps", "1", "--start", saved_policy, "--out", out,
                                   "--force", "--quiet", *TRUST_FAST_SET])
    assert "is not a credo output directory" in line and snapshot(out) == before
    shutil.rmtree(out)
    os.makedirs(out)  # an audit output of credo's: what --force replaces
    for name, text in ((".credo-kind", "audit\n"), ("audit.json", "{}"), ("audit.md", "old")):
        open(os.path.join(out, name), "w").write(text)
    assert main(["train", "--method", "grpo", "--steps", "1", "--start", saved_policy, "--out", out, "--force",
                 "--quiet", *TRUST_FAST_SET]) == 0
    assert not os.path.exists(os.path.join(out, "audit.json"))
    assert os.path.isfile(os.path.join(out, "final", "policy.json"))
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")], "nothing left beside --out"
    # a second `train --out` on a finished run is refused (it is a run of the same kind, with checkpoints)
    line = one_line_error(capsys, ["train", "--steps", "1", "--start", saved_policy, "--out", out, "--quiet"])
    assert f"--resume {out}" in line and "--force" in line


def test_run_that_failed_before_its_first_checkpoint_is_restartable(tmp_path, capsys, saved_policy):
    out = str(tmp_path / "run")
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n')
    # a run that dies at its first step: every reward of this task is inf
    from credo.tasks.arith import ArithTask
    original = ArithTask.reward
    ArithTask.reward = lambda self, problem, completion: float("inf")
    try:
        line = one_line_error(capsys,
                              ["train", "--start", saved_policy, "--steps", "2", "--out", out,
                               "--quiet", *TRUST_FAST_SET])
    finally:
        ArithTask.reward = original
    assert "reward of row 0" in line and "inf" in line and "never reached a checkpoint" in line
    assert os.path.exists(os.path.join(out, "config.yaml")) and not os.path.exists(os.path.join(out, "checkpoints"))
    # the corrected command (here: the same one, with a finite reward) simply starts again
    assert main(["train", "--start", saved_policy, "--steps", "2", "--out", out, "--quiet", *TRUST_FAST_SET]) == 0
    assert "never reached a checkpoint" in capsys.readouterr().err
    assert os.path.isfile(os.path.join(out, "summary.json"))


def test_torn_last_metrics_line_does_not_block_resume(tmp_path, saved_policy):
    full = Trainer(train_config(saved_policy), str(tmp_path / "full"), progress=False)
    full.train()
    run = str(tmp_path / "torn")
    killed_run(saved_policy, run)
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write('{"step": 4, "tokens_gen')  # killed mid-write
    resumed = Trainer(train_config(saved_policy), run, progress=False)
    resumed.train()
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(resumed.log.rows()) == strip(full.log.rows())
    a = load_policy(str(tmp_path / "full" / "final")).model.state_dict()
    b = load_policy(os.path.join(run, "final")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_torn_line_before_the_end_is_an_error_naming_it(tmp_path):
    from credo.core.files import MetricsLog
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        MetricsLog(str(path)).truncate_after(5)


def test_resume_with_different_settings_lists_them(tmp_path, capsys, saved_policy):
    run = str(tmp_path / "run")
    killed_run(saved_policy, run)
    before = snapshot(run)
    line = one_line_error(capsys, ["train", "--resume", run, "--method", "rloo", "--seed", "3", "--set", "lr=0.5",
                                   "--quiet"])
    for part in ("train.method: run has 'grpo', command asks 'rloo'", "train.seed: run has 0, command asks 3",
                 "train.lr: run has 0.001, command asks 0.5"):
        assert part in line
    line = one_line_error(capsys, ["train", "--resume", run, "--out", str(tmp_path / "elsewhere"), "--quiet"])
    assert "--out" in line
    assert snapshot(run) == before
    # the same settings repeated are not differences
    assert main(["train", "--resume", run, "--set", "lr=1e-3", "--quiet"]) == 0


@pytest.mark.parametrize("content,expect",
                         [("", "is empty"), ("method: grpo\nsteps: 4\nprompts_per_step: 2\n", "lacks train.seed"),
                                            ("method: [grpo\n", "not valid YAML")])
def test_empty_or_truncated_config_yaml_is_an_error(tmp_path, capsys, saved_policy, content, expect):
    run = str(tmp_path / "run")
    killed_run(saved_policy, run)
    open(os.path.join(run, "config.yaml"), "w").write(content)
    before = snapshot(run)
    line = one_line_error(capsys, ["train", "--resume", run, "--quiet"])
    assert expect in line and "config.yaml" in line
    assert snapshot(run) == before


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(tmp_path, saved_policy):
    run = str(tmp_path / "run")
    trainer = Trainer(train_config(saved_policy, "checkpoint_every=1"), run, progress=False)
    trainer.train(stop_after=2)
    good = snapshot(os.path.join(run, "checkpoints"))
    original = trainer.policy.score

    def poisoned(*args, **kwargs):
        logprobs, entropy = original(*args, **kwargs)
        return logprobs * float("nan"), entropy

    trainer.policy.score = poisoned
    with pytest.raises(TrainingDiverged, match=r"step 3: non-finite loss \(nan\).*step-000002"):
        trainer.train()
    assert snapshot(os.path.join(run, "checkpoints")) == good
    assert [r["step"] for r in trainer.log.rows()] == [0, 1, 2]


def test_out_kinds_are_not_mixed(tmp_path, capsys, saved_policy):
    out = str(tmp_path / "sft")
    shutil.copytree(saved_policy, out)
    open(os.path.join(out, "sft_config.yaml"), "w").write("{}\n")
    before = snapshot(out)
    line = one_line_error(capsys, ["train", "--start", saved_policy, "--out", out, "--quiet"])
    assert "holds a credo sft output" in line
    assert snapshot(out) == before
    assert json.loads(json.dumps(before)) == before  # snapshot is plain data
    # ...covering every file `out` held (the start's and the sft marker), so the equality above compares them all
    assert set(before) == set(os.listdir(saved_policy)) | {"sft_config.yaml"}


def test_sft_out_of_the_same_kind_is_replaced_whole(tmp_path, capsys):
    out = str(tmp_path / "sft")
    assert main(["sft", "--out", out, "--eval-n", "2", "--quiet"]) == 0
    open(os.path.join(out, "stale.txt"), "w").write("from an older copy")
    assert main(["sft", "--out", out, "--eval-n", "2", "--quiet"]) == 0
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model.safetensors", "policy.json", "sft_config.yaml",
                                       "sft_summary.json"]
    assert not [f for f in os.listdir(tmp_path) if f != "sft"], "nothing left beside --out"


def test_is_within_resolves_links_and_does_not_match_a_sibling_prefix(tmp_path):
    from credo.core.files import is_within
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs-old").mkdir()
    os.symlink(tmp_path / "runs" / "a", tmp_path / "link")
    assert is_within(str(tmp_path / "runs" / "a"), str(tmp_path / "runs"))
    assert is_within(str(tmp_path / "runs"), str(tmp_path / "runs" / ".." / "runs"))
    assert is_within(str(tmp_path / "link"), str(tmp_path / "runs"))
    assert not is_within(str(tmp_path / "runs-old"), str(tmp_path / "runs"))
    assert not is_within(str(tmp_path / "runs"), str(tmp_path / "runs" / "a"))


def test_atomic_copy_leaves_the_old_file_whole_when_the_copy_fails(tmp_path, monkeypatch):
    from credo.core import files as runs
    (tmp_path / "new").write_bytes(b"new contents")
    (tmp_path / "old").write_bytes(b"old contents")
    runs.atomic_copy(str(tmp_path / "new"), str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == b"new contents"

    def half_copy(source, target):
        with open(target, "wb") as f:
            f.write(b"ne")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(runs.shutil, "copyfile", half_copy)
    from credo.core.disk_errors import DiskError
    with pytest.raises(DiskError, match="No space left on device"):
        runs.atomic_copy(str(tmp_path / "new"), str(tmp_path / "old"))
    assert (tmp_path / "old").read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "new", "old"]


@pytest.mark.parametrize("argv, expect", [
    (["audit", "--checkpoint", "{etc}"], "audit.checkpoint='{etc}': {etc} is neither a credo checkpoint"),
    (["show", "--checkpoint", "{etc}"], "show.checkpoint='{etc}': {etc} is neither a credo checkpoint"),
    (["compare", "--preset", "quick", "--yes", "--start", "{etc}"], "compare --start='{etc}': {etc} is neither"),
    (["compare", "--preset", "quick", "--yes", "--start", "{etc}/missing"], "compare --start='{etc}/missing': no such"),
    (["audit", "--checkpoint", "{weightless}"], "{weightless}/model.safetensors is missing"),
    (["show", "--task", "nosuch"], "unknown task 'nosuch'"),
    (["audit", "--task", "jsonl:{etc}/missing.jsonl"], "missing.jsonl does not exist"),
])
def test_a_wrong_input_is_one_line_and_leaves_no_output_behind(tmp_path, capsys, argv, expect):
    # the checkpoint and task are checked before --out is claimed: a typo leaves no empty run directory
    # (and a comparison does not time, start and fail every run on a start that is not a checkpoint)
    etc = tmp_path / "not-a-checkpoint"
    etc.mkdir()
    (etc / "notes.txt").write_text("not a model")
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "policy.json").write_text('{"backend": "tiny"}')
    where = {"etc": str(etc), "weightless": str(weightless)}
    out = tmp_path / "out"
    line = one_line_error(capsys, [a.format(**where) for a in argv] + ["--out", str(out)])
    assert expect.format(**where) in line
    assert not out.exists()


COMPARE_FULL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "results", "compare-full")


def test_a_committed_export_is_reusable_though_an_older_credo_wrote_default_credit_options_as_empty(tmp_path):
    """compare-full's runs record `credit: {}` (an older credo left default options out); today's runs record
    them whole. Compared as the estimator's config, they are the same training: every run is reused. dapo's
    recipe has changed since (overlong_fit_task): a real difference, refused with advice that trains nothing."""
    from dataclasses import replace
    from credo.lab.compare.presets import check_reusable, resolve_preset, run_dir_name
    export = str(tmp_path / "compare-full")
    shutil.copytree(COMPARE_FULL, export)
    recorded = json.load(open(os.path.join(export, "results.json")))
    methods = recorded["command"].split("--methods ")[1].split()[0].split(",")
    preset = resolve_preset("full", tuple(m for m in methods if m != "dapo"), None, None, None)
    preset = replace(preset, train={**preset.train, "device": "cpu", "dtype": "float32"})  # as compare places them
    plan = [(m, s, os.path.join(export, "runs", run_dir_name(m, s))) for s in preset.seeds for m in preset.methods]
    assert yaml.safe_load(open(os.path.join(plan[0][2], "config.yaml")))["credit"] == {}
    check_reusable(plan, preset, "")  # no error: every finished run is reused
    with_dapo = replace(preset, methods=("dapo",))
    with pytest.raises(ConfigError, match=r"dapo-s0 was made with a different config \(overlong_fit_task: False -> "
                                          r"True\); it finished: `credo compare --report-only` rebuilds"):
        check_reusable([("dapo", 0, os.path.join(export, "runs", "dapo-s0"))], with_dapo, "")


def test_a_resume_compares_credit_options_as_the_estimators_config():
    from credo.train.plan import load_train_config
    from credo.train.resume_checks import config_changes
    """An older checkpoint recorded `credit: {}`: the same defaults are no change, and an option edited into
    config.yaml since is one (before, `{}` and `{lam: 0.75}` shared no key, so nothing was compared)."""
    config = load_train_config(None, ["method=rredcot"])
    saved = {**to_dict(config), "credit": {}}  # what an older credo recorded for the same defaults
    assert config_changes(saved, config) == []
    edited = load_train_config(None, ["method=rredcot", "credit.lam=0.75"])
    changed = config_changes(saved, edited)
    assert len(changed) == 1 and changed[0].startswith("train.credit.lam: checkpoint ") and "now 0.75" in changed[0]
