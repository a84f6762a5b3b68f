"""Credit you can inspect after the run (credo.train.credit_log): `credo train` writes a few rows' per-token credit
and its parts every train.credit_log_every steps; the parts add up (credit = advantage x weight = GRPO part +
credit part); the log changes nothing else of the run (same metrics, same weights, same config.yaml at its
default); `credo show --run RUN --step N` draws the logged credit as the heat map; a step the run did not log is
one line naming the steps it has; the trackers get the parts as separate metrics."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from builders import dapo_config, strip_time
from credo.cli.main import main
from credo.core.groups import grpo_advantages
from credo.integrations.tracking import TrackedLog
from credo.policy import load_policy
from credo.train.credit_log import logged_steps, read_step
from credo.train.trainer import Trainer


def train(saved_policy, run, *extra):
    trainer = Trainer(dapo_config(saved_policy, "steps=2", *extra), str(run), progress=False)
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two 2-step rredcot runs from one start: credit logged every step (4 rows), and none."""
    from builders import tiny_policy
    root = tmp_path_factory.mktemp("credit_log")
    start = str(root / "start")
    tiny_policy().save(start)
    logged = train(start, root / "logged", "method=rredcot", "credit_log_every=1", "credit_log_rows=4")
    plain = train(start, root / "plain", "method=rredcot", "credit_log_every=0")
    return root, logged, plain


def test_the_log_is_written_every_n_steps_and_its_parts_add_up(runs):
    root, logged, _ = runs
    run = str(root / "logged")
    assert logged_steps(run) == [1, 2]
    tensors, meta = read_step(run, 2)
    assert meta["step"] == 2 and meta["method"] == "rredcot" and len(meta["rows"]) == 4
    assert len(set(tensors["group"].tolist())) == 1  # one whole group (group_size 4)
    assert len(meta["tokens"]) == 4 and all(len(t) == int(m.sum()) for t, m in
                                            zip(meta["tokens"], tensors["completion_mask"]))
    credit, mask = tensors["credit"], tensors["loss_mask"].bool()
    assert torch.allclose(credit, tensors["advantage"] * tensors["weight"])
    assert torch.allclose(tensors["grpo_part"] + tensors["credit_part"], credit)
    assert (credit[~mask] == 0).all() and (tensors["weight"][~mask] == 0).all()
    # the GRPO part is the row's GRPO advantage in its group (the logged rows are a whole group)
    group_a = grpo_advantages(tensors["rewards"], torch.zeros(4, dtype=torch.long))
    assert torch.allclose(tensors["grpo_part"], group_a[:, None] * mask, atol=1e-6)
    assert tensors["credit_part"].abs().max() > 0  # rredcot moves credit off the outcome's share


def test_the_logged_rows_are_whole_groups_those_whose_rewards_differ_first():
    from credo.train.credit_log import logged_rows
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert logged_rows(rewards, group, 4) == [3, 4, 5, 0]
    assert logged_rows(torch.zeros(9), group, 20) == list(range(9))


def test_the_log_changes_nothing_else_of_the_run(runs):
    root, logged, plain = runs
    assert strip_time(logged.log.rows()) == strip_time(plain.log.rows())
    a = load_policy(str(root / "logged" / "final")).model.state_dict()
    b = load_policy(str(root / "plain" / "final")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not os.path.exists(root / "plain" / "credit")  # 0: off


def test_config_yaml_leaves_the_log_settings_out_at_their_defaults(saved_policy, tmp_path):
    trainer = train(saved_policy, tmp_path / "run", "steps=1", "checkpoint_every=1")
    text = (tmp_path / "run" / "config.yaml").read_text()
    assert "credit_log" not in text
    assert logged_steps(str(tmp_path / "run")) == []  # default every 10 steps: none in a 1-step run
    assert trainer.config.credit_log_every == 10 and trainer.config.credit_log_rows == 4


def test_grpo_has_no_credit_part(saved_policy, tmp_path):
    train(saved_policy, tmp_path / "g", "method=grpo", "steps=1", "credit_log_every=1")
    tensors, _ = read_step(str(tmp_path / "g"), 1)
    assert tensors["credit_part"].abs().max() < 1e-5 and tensors["grpo_part"].abs().max() > 0.1


def test_credo_show_run_draws_the_logged_credit(runs, tmp_path, capsys):
    root, _, _ = runs
    out = tmp_path / "page"
    assert main(["show", "--run", str(root / "logged"), "--step", "2", "--out", str(out), "--quiet"]) == 0
    page = (out / "index.html").read_text()
    for column in ("credit", "GRPO part", "credit part", "weight - 1", "clipped"):
        assert f"data-method='{column}'" in page
    assert page.count("class='info' data-trace=") == 4 and "data-credit=" in page
    assert main(["show", "--run", str(root / "logged"), "--step", "2", "--terminal"]) == 0
    assert "credit part" in capsys.readouterr().out


def test_a_step_the_run_did_not_log_is_one_line_naming_the_logged_steps(runs, tmp_path, capsys):
    root, _, _ = runs
    assert main(["show", "--run", str(root / "logged"), "--step", "7", "--terminal"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--step 7:" in err[0] and "it has steps 1, 2" in err[0]
    assert main(["show", "--run", str(root / "plain"), "--step", "1", "--terminal"]) == 2
    assert "it has none" in capsys.readouterr().err
    assert main(["show", "--step", "1", "--terminal"]) == 2
    assert "give --run RUN too" in capsys.readouterr().err


def test_the_trackers_get_the_parts_and_the_record_does_not(saved_policy, tmp_path):
    class Recording:
        def __init__(self):
            self.rows = []

        def log_metrics(self, row):
            self.rows.append(row)

    class Record:
        def __init__(self):
            self.rows = []

        def append(self, row):
            self.rows.append(row)

    trackers, record = Recording(), Record()
    trainer = Trainer(dapo_config(saved_policy, "steps=1", "method=rredcot"), str(tmp_path / "t"), progress=False)
    trainer.config = dataclasses.replace(trainer.config, report_to=("tensorboard",))  # no tensorboard needed: stubs
    trainer.log = TrackedLog(record, trackers)
    trainer.begin = lambda: None  # the trackers are the ones above
    trainer.train()
    parts = {k for k in trackers.rows[-1] if k.startswith("credit/")}
    assert parts == {"credit/credit_abs_mean", "credit/grpo_part_abs_mean", "credit/credit_part_abs_mean",
                     "credit/weight_mean", "credit/clipped_frac"}
    assert not any(k.startswith("credit/") for k in record.rows[-1])


def test_a_run_with_its_credit_log_is_still_all_credos_own(runs, tmp_path):
    """--force may replace a run directory holding credit/ (credo wrote it), and a run without its marker is still
    recognised as a run by its files."""
    import shutil
    from credo.core.outputs import KIND_MARKER, foreign_entries, run_kind
    root, _, _ = runs
    copy = tmp_path / "copy"
    shutil.copytree(root / "logged", copy)
    assert foreign_entries(str(copy), "train") == []
    (copy / KIND_MARKER).unlink()
    assert run_kind(str(copy)) == "train"
