"""Experiment trackers (`report_to`): what a run logs is read back with each tracker's own reader and must equal
the run's metrics.jsonl, config and summary.json. Nothing is mocked: the runs are real (tiny) trainings."""

from __future__ import annotations

import glob
import json
import os
import struct
import sys

import numpy as np
import pytest
import yaml

from credo.cli.main import main
from credo.lab.compare.run import compare
from credo.integrations import tracking
from credo.core.files import read_jsonl
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer

from conftest import tiny_policy

FAST = ["eval_n=4", "final_eval_n=4", "eval_every=2", "checkpoint_every=2", "prompts_per_step=2", "group_size=4",
        "sampling.max_new_tokens=12"]


def event_scalars(logdir: str) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of a TensorBoard log directory, read by TensorBoard's own EventAccumulator (which
    applies purge_step as TensorBoard's UI does)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    out: dict[str, dict[int, float]] = {}
    for tag in events.Tags()["scalars"]:
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), f"{tag}: a step logged twice {steps}"
        out[tag] = {e.step: e.value for e in events.Scalars(tag)}
    return out


def jsonl_metrics(run_dir: str) -> dict[str, dict[int, float]]:
    """{metric: {step: value}} of a run's metrics.jsonl: every number of every row but the step."""
    out: dict[str, dict[int, float]] = {}
    for row in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        for key, value in row.items():
            if key != "step":
                assert isinstance(value, (int, float)), f"{key}={value!r}: a non-numeric metric"
                out.setdefault(key, {})[row["step"]] = value
    return out


CREDIT_PARTS = {"credit/credit_abs_mean", "credit/grpo_part_abs_mean", "credit/credit_part_abs_mean",
                "credit/weight_mean", "credit/clipped_frac"}
"""What the trackers get beside metrics.jsonl's rows: the parts of each training step's credit (credit_log.py)."""


def without_credit_parts(by_step: dict) -> dict:
    """{step: metrics} with the credit parts taken out, after checking every training step (a row with a
    reward_mean) has them all, finite, and no other step has any."""
    out = {}
    for step, items in by_step.items():
        parts = {k for k in items if k.startswith("credit/")}
        assert parts == (CREDIT_PARTS if "reward_mean" in items else set()), step
        assert all(np.isfinite(items[k]) for k in parts)
        out[step] = {k: v for k, v in items.items() if k not in parts}
    return out


def assert_tensorboard_holds_the_run(logdir: str, run_dir: str) -> None:
    scalars = event_scalars(logdir)
    metrics = jsonl_metrics(run_dir)
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    expected_tags = set(metrics) | CREDIT_PARTS | {f"summary/{k}" for k, v in summary.items()
                                                   if isinstance(v, (int, float)) and k != "step"}
    assert set(scalars) == expected_tags
    for part in CREDIT_PARTS:  # every training step (the steps with a reward), and only those
        assert set(scalars[part]) == set(metrics["reward_mean"]), part
    for name, by_step in metrics.items():  # TensorBoard stores float32: each value is the jsonl's, so rounded
        assert scalars[name] == {step: float(np.float32(v)) for step, v in by_step.items()}, name
    assert scalars["summary/final_accuracy"] == {summary["step"]: float(np.float32(summary["final_accuracy"]))}


def test_report_to_tensorboard_event_file_holds_every_metric_of_metrics_jsonl(saved_policy, tmp_path, capsys):
    out = str(tmp_path / "run")
    code = main(["train", "--out", out, "--start", saved_policy, "--steps", "3", "--quiet",
                 *[a for s in FAST for a in ("--set", s)], "--set", "report_to=tensorboard"])
    assert code == 0, capsys.readouterr().err
    assert_tensorboard_holds_the_run(os.path.join(out, "tensorboard", "run"), out)
    assert len(jsonl_metrics(out)["reward_mean"]) == 3  # steps 1..3 (step 0 is the start's evaluation)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(os.path.join(out, "tensorboard", "run"))
    events.Reload()
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads("\n".join(line[4:] for line in config_text.splitlines())) == yaml.safe_load(
        open(os.path.join(out, "config.yaml")))


def test_a_resumed_run_shows_each_step_once_in_tensorboard(saved_policy, tmp_path):
    config = load_train_config(None, [f"start={saved_policy}", "steps=4", *FAST, "report_to=tensorboard"])
    run = str(tmp_path / "killed")
    Trainer(config, run, progress=False).train(stop_after=3)  # dies after step 3; its checkpoint is step 2
    Trainer(config, run, progress=False).train()  # steps 3 and 4 again: the first process's step 3 is purged
    assert_tensorboard_holds_the_run(os.path.join(run, "tensorboard", "killed"), run)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One tiny training run that reports to wandb, mlflow and trackio (trackio's store under tmp)."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    pytest.importorskip("trackio")
    base = tmp_path_factory.mktemp("tracked")
    patch = pytest.MonkeyPatch()
    patch.setenv("TRACKIO_DIR", str(base / "trackio"))
    for name in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI"):
        patch.delenv(name, raising=False)
    import trackio  # noqa: F401  (its modules read TRACKIO_DIR once, at import)
    for module in [m for n, m in sys.modules.items() if n.startswith("trackio") and hasattr(m, "TRACKIO_DIR")]:
        patch.setattr(module, "TRACKIO_DIR", base / "trackio")
    start = str(base / "start")
    tiny_policy().save(start)
    run = str(base / "run")
    config = load_train_config(None, [f"start={start}", "steps=2", *FAST, "report_to=wandb,mlflow,trackio"])
    Trainer(config, run, progress=False).train()
    import wandb
    wandb.teardown()  # the run file's last block reaches disk when W&B's service lets the run go, not at finish
    yield run, base
    patch.undo()


def wandb_records(path: str) -> list:
    """The records of a W&B run file (`run-<id>.wandb`: W&B's LevelDB-style log of 32 KiB blocks, each record a
    7-byte header crc32/length/type then a chunk), decoded with W&B's own protobuf schema."""
    from wandb.proto import wandb_internal_pb2
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    block, pos, chunks, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is zero padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:  # FULL
            chunks.append(chunk)
        elif kind in (2, 3):  # FIRST, MIDDLE
            pending += chunk
        elif kind == 4:  # LAST
            chunks.append(pending + chunk)
            pending = b""
    records = []  # an item names its key in `key` or (newer W&B) in `nested_key`: wandb_key() reads either
    for chunk in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


def wandb_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_holds_the_rows_config_and_summary(tracked_run):
    run, _ = tracked_run
    files = glob.glob(os.path.join(run, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(files) == 1
    records = wandb_records(files[0])
    opened = [r.run for r in records if r.WhichOneof("record_type") == "run"][0]
    assert opened.display_name == "run" and opened.project == "credo"
    config = {wandb_key(i): json.loads(i.value_json) for i in opened.config.update if wandb_key(i) != "_wandb"}
    assert config == yaml.safe_load(open(os.path.join(run, "config.yaml")))
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {wandb_key(i): json.loads(i.value_json) for i in r.history.item}
            history[items.pop("_step")] = {k: v for k, v in items.items() if not k.startswith("_")}
    rows = read_jsonl(os.path.join(run, "metrics.jsonl"))
    assert without_credit_parts(history) == {r["step"]: {k: float(v) for k, v in r.items() if k != "step"}
                                             for r in rows}
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({wandb_key(i): json.loads(i.value_json) for i in r.summary.update})
    assert {k: summary[k] for k in ("final_accuracy", "credo_commit", "tokens_generated")} == {
        k: v for k, v in json.load(open(os.path.join(run, "summary.json"))).items()
        if k in ("final_accuracy", "credo_commit", "tokens_generated")}


def test_mlflow_file_store_holds_the_rows_config_and_summary(tracked_run):
    from mlflow.tracking import MlflowClient
    run, _ = tracked_run
    client = MlflowClient(tracking_uri="file://" + os.path.join(run, "mlruns"))
    experiment = client.get_experiment_by_name("credo")
    [found] = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "run" and found.info.status == "FINISHED"
    config = yaml.safe_load(open(os.path.join(run, "config.yaml")))
    assert found.data.params["lr"] == json.dumps(config["lr"])
    assert found.data.params["loss.eps_low"] == json.dumps(config["loss"]["eps_low"])
    for name, by_step in jsonl_metrics(run).items():
        logged = {m.step: m.value for m in client.get_metric_history(found.info.run_id, name)}
        assert logged == {step: float(v) for step, v in by_step.items()}, name
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert found.data.metrics["summary/final_accuracy"] == summary["final_accuracy"]


def test_trackio_store_holds_the_rows_and_config(tracked_run):
    from trackio.sqlite_storage import SQLiteStorage
    run, base = tracked_run
    assert os.path.isfile(base / "trackio" / "credo.db")
    logs = SQLiteStorage.get_logs("credo", "run")
    by_step: dict[int, dict] = {}
    for entry in logs:
        by_step.setdefault(entry["step"], {}).update({k: v for k, v in entry.items() if k not in ("step", "timestamp")})
    summary = json.load(open(os.path.join(run, "summary.json")))
    rows = read_jsonl(os.path.join(run, "metrics.jsonl"))
    expected = {r["step"]: {k: float(v) for k, v in r.items() if k != "step"} for r in rows}
    expected[summary["step"]].update({f"summary/{k}": float(v) for k, v in summary.items()
                                      if isinstance(v, (int, float)) and k != "step"})
    assert without_credit_parts(by_step) == expected
    config = SQLiteStorage.get_run_config("credo", "run")
    assert config["lr"] == yaml.safe_load(open(os.path.join(run, "config.yaml")))["lr"]


@pytest.mark.slow
def test_compare_logs_each_run_to_its_own_tracker_run_grouped_by_the_comparison(saved_policy, tmp_path):
    pytest.importorskip("mlflow")
    out = str(tmp_path / "cmp-a")
    compare("smoke", out, methods=("rloo",), start=saved_policy, progress=False, token_budget=400,
            report_to=("tensorboard", "mlflow"))
    names = sorted(os.listdir(os.path.join(out, "runs")))
    assert names == ["grpo-s0", "rloo-s0"]
    assert sorted(os.listdir(os.path.join(out, "tensorboard"))) == names  # a subdirectory per run
    for name in names:
        assert_tensorboard_holds_the_run(os.path.join(out, "tensorboard", name), os.path.join(out, "runs", name))
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri="file://" + os.path.join(out, "mlruns"))
    experiment = client.get_experiment_by_name("cmp-a")  # one experiment per comparison, named after --out
    assert sorted(r.info.run_name for r in client.search_runs([experiment.experiment_id])) == names


@pytest.mark.parametrize("command", ["train", "compare"])
def test_an_unknown_tracker_is_one_line_naming_the_field_and_the_allowed_names(command, tmp_path, capsys):
    code = main([command, "--out", str(tmp_path / "o"), "--set", "report_to=tensorboard,tb"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{command}.report_to: unknown tracker 'tb'; allowed: tensorboard, wandb, mlflow, trackio" in err
    assert not os.path.exists(tmp_path / "o")


def test_a_tracker_whose_package_is_missing_names_the_extra_to_install(saved_policy, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(tracking.PACKAGES, "wandb", "credo_test_no_such_package")
    code = main(["train", "--out", str(tmp_path / "o"), "--start", saved_policy, "--steps", "1",
                 "--set", "report_to=wandb"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "train.report_to: wandb is not installed; install it with: pip install 'credo[wandb]'" in err
    assert not os.path.exists(tmp_path / "o")


def test_report_to_none_and_empty_mean_no_tracker():
    assert load_train_config(None, ["report_to=none"]).report_to == ()
    assert load_train_config(None, []).report_to == ()
    with pytest.raises(tracking.ConfigError, match="train.report_to names tensorboard twice"):
        load_train_config(None, ["report_to=[tensorboard,tensorboard]"])


def test_a_resume_may_add_a_tracker(saved_policy, tmp_path, capsys):
    out = str(tmp_path / "run")
    sets = [a for s in FAST for a in ("--set", s)]
    assert main(["train", "--out", out, "--start", saved_policy, "--steps", "2", "--quiet", *sets]) == 0
    code = main(["train", "--resume", out, "--steps", "3", "--quiet", "--set", "report_to=tensorboard"])
    assert code == 0, capsys.readouterr().err
    assert yaml.safe_load(open(os.path.join(out, "config.yaml")))["report_to"] == ["tensorboard"]
    scalars = event_scalars(os.path.join(out, "tensorboard", "run"))
    assert scalars["reward_mean"] == {3: float(np.float32(jsonl_metrics(out)["reward_mean"][3]))}  # from the resume on


def test_a_comparison_reuses_its_runs_whatever_they_report_to(saved_policy, tmp_path):
    from credo.lab.compare.presets import check_reusable, resolve_preset, run_config, run_dir_name
    from credo.core.config import ConfigError, dump_yaml
    preset = resolve_preset("smoke", ("rloo",), None, None, None)
    plan = [(m, 0, str(tmp_path / "runs" / run_dir_name(m, 0))) for m in preset.methods]
    for method, seed, run_dir in plan:  # runs made by a comparison that reported to TensorBoard
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            f.write(dump_yaml(run_config(method, seed, preset, saved_policy, ("tensorboard",))))
    check_reusable(plan, preset, saved_policy)  # the same training: reused
    with pytest.raises(ConfigError, match="was made with a different config"):
        check_reusable(plan, resolve_preset("smoke", ("rloo",), None, 3000, None), saved_policy)


def test_wandb_groups_a_comparisons_runs_by_the_comparison(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    place = tracking.TrackingPlace(root=str(tmp_path), run_name="grpo-s0", group="cmp-a")
    trackers = tracking.Trackers(["wandb"], place, {"lr": 0.001})
    trackers.log_metrics({"step": 0, "eval_accuracy": 0.5})
    trackers.close()
    import wandb
    wandb.teardown()  # the run file's last block reaches disk when W&B's service lets the run go, not at finish
    [path] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    [opened] = [r.run for r in wandb_records(path) if r.WhichOneof("record_type") == "run"]
    assert (opened.run_group, opened.display_name, opened.project) == ("cmp-a", "grpo-s0", "credo")


def test_none_with_a_tracker_is_refused_without_calling_none_allowed(capsys, tmp_path):
    """Before: 'unknown tracker none; allowed: ... (or none)', which named what it refused as allowed."""
    code = main(["train", "--out", str(tmp_path / "o"), "--set", "report_to=none,tensorboard"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "train.report_to: none means no tracker, so it stands alone; got none,tensorboard" in err
    assert "unknown tracker" not in err


def test_a_tracker_store_that_is_a_file_is_one_line_before_anything_runs(saved_policy, tmp_path, capsys):
    out = str(tmp_path / "run")
    sets = [a for s in FAST for a in ("--set", s)]
    assert main(["train", "--out", out, "--start", saved_policy, "--steps", "2", "--quiet", *sets]) == 0
    open(os.path.join(out, "tensorboard"), "w").close()  # before: a raw "[Errno 20] Not a directory"
    code = main(["train", "--resume", out, "--steps", "3", "--quiet", "--set", "report_to=tensorboard"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"train.report_to: tensorboard keeps its store in {out}/tensorboard, which is a file, not a folder" in err
    assert max(r["step"] for r in read_jsonl(os.path.join(out, "metrics.jsonl"))) == 2  # not resumed


def test_wandb_online_without_a_key_is_one_line_naming_wandb(saved_policy, tmp_path, capsys, monkeypatch):
    """Before: a 44-line traceback from wandb.init."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc key either
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    code = main(["train", "--out", str(tmp_path / "o"), "--start", saved_policy, "--steps", "1", "--quiet",
                 "--set", "report_to=wandb", *[a for s in FAST for a in ("--set", s)]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "report_to wandb: opening the tracker failed (" in err[0] and "Traceback" not in err[0]
    assert not os.path.exists(tmp_path / "o" / "metrics.jsonl")  # opened before step 0's evaluation


def test_an_unreachable_mlflow_server_is_one_line_within_the_connect_timeout(saved_policy, tmp_path, capsys,
                                                                             monkeypatch):
    """Before: `credo train` waited at step 0 with nothing printed (150 s and more)."""
    import socket
    with socket.socket() as free:  # a port nothing listens on: the connection is refused at once
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    code = main(["train", "--out", str(tmp_path / "o"), "--start", saved_policy, "--steps", "1", "--quiet",
                 "--set", "report_to=mlflow"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"train.report_to: mlflow cannot reach MLFLOW_TRACKING_URI=http://127.0.0.1:{port} (" in err[0]
    assert not os.path.exists(tmp_path / "o")


def test_a_tracker_that_fails_stops_a_comparison_instead_of_failing_every_method(saved_policy, tmp_path,
                                                                                monkeypatch):
    """A tracker fails every run alike: the comparison stops in one line, no method is recorded as failed."""
    from dataclasses import replace

    def broken(place, config):
        raise RuntimeError("the tracking server said no")
    monkeypatch.setitem(tracking.TRACKERS._entries, "tensorboard",
                        replace(tracking.TRACKERS._entries["tensorboard"], fn=broken))
    out = str(tmp_path / "cmp")
    with pytest.raises(tracking.TrackerError, match="report_to tensorboard: opening the tracker failed "
                                                    r"\(RuntimeError: the tracking server said no\)"):
        compare("smoke", out, methods=("rloo",), start=saved_policy, progress=False, token_budget=400,
                report_to=("tensorboard",), jobs=1)
    assert not glob.glob(os.path.join(out, "failure-*.txt")) and not os.path.exists(os.path.join(out, "results.json"))
