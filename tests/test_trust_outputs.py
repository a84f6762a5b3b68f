"""Trust, round two: what --out and --force may take, a run that died writing its first checkpoint, and what
the checksums promise (a checkpoint without its config record, an edited audit cache entry)."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys

import pytest

from credo.cli.main import main
from credo.core.disk_errors import as_disk_error, is_disk_error
from builders import TRUST_FAST_SET, audit_cache_entry, one_line_error, snapshot



# --- a run that died writing its first checkpoint -------------------------------------------------------

def _train_argv(start: str, out: str) -> list[str]:
    return ["train", "--method", "grpo", "--start", start, "--steps", "2", "--out", out, "--quiet", *TRUST_FAST_SET]


def _limit_file_size(size: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


def test_a_file_size_limit_is_a_disk_error():
    err = OSError(errno.EFBIG, "File too large")
    assert is_disk_error(err)
    assert str(as_disk_error(err, where="/runs/a/model.safetensors")) == (
        "File too large: /runs/a/model.safetensors; raise the file-size limit (ulimit -f), or write elsewhere, "
        "then rerun")


def test_a_run_killed_by_a_file_size_limit_at_its_first_checkpoint_restarts_with_the_same_command(
        tmp_path, capsys, saved_policy):
    """A real RLIMIT_FSIZE below the weights' size: the first checkpoint cannot be written (EFBIG). One line, no
    traceback; the same `--out` command, run again without the limit, then trains the run to its end."""
    out = str(tmp_path / "run")
    argv = [sys.executable, "-m", "credo.cli", *_train_argv(saved_policy, out)]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, preexec_fn=_limit_file_size(64 * 1024))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith(f"credo train: error: File too large: {out}/checkpoints/step-000002")
    assert "never reached a checkpoint" in lines[0] and "the same `credo train --out` again" in lines[0]
    assert os.path.isdir(os.path.join(out, "checkpoints"))  # the folder the failed write made: not a run
    assert main(_train_argv(saved_policy, out)) == 0
    assert "never reached a checkpoint; replacing it" in capsys.readouterr().err
    assert os.path.isfile(os.path.join(out, "summary.json"))
    assert os.listdir(os.path.join(out, "checkpoints")) == ["step-000002"]


def test_an_empty_or_half_written_checkpoints_folder_is_not_a_run(tmp_path, capsys, saved_policy):
    from builders import killed_run
    out = tmp_path / "run"
    killed_run(saved_policy, str(out), stop_after=1)  # step 1 of checkpoint_every=2: no checkpoint yet
    (out / "checkpoints" / ".tmp-step-000002-x1y2").mkdir(parents=True)  # what a killed first write leaves
    (out / "checkpoints" / ".tmp-step-000002-x1y2" / "model.safetensors").write_bytes(b"half")
    assert main(_train_argv(saved_policy, str(out))) == 0
    assert "never reached a checkpoint; replacing it" in capsys.readouterr().err
    assert sorted(os.listdir(out / "checkpoints")) == ["step-000002"]


# --- what --force may replace ---------------------------------------------------------------------------

def _audit_output(folder):
    """A credo audit output holding nothing else: what --force may replace, but for where it lies."""
    folder.mkdir(parents=True)
    (folder / ".credo-kind").write_text("audit\n")
    (folder / "audit.json").write_text("{}\n")
    return folder


def _force_argv(command: str, start: str, out: str) -> list[str]:
    """Every command that takes --force, with its cheapest settings."""
    argv = {"train": ["train", "--method", "grpo", "--steps", "1", "--start", start, *TRUST_FAST_SET],
            "sft": ["sft"],
            "audit": ["audit", "--checkpoint", start, "--n", "4", "--group-size", "2", "--k-ref", "2"],
            "compare": ["compare", "--preset", "smoke", "--start", start],
            "show": ["show", "--checkpoint", start, "--n", "2"]}[command]
    return [*argv, "--out", out, "--force", "--quiet"]


FORCE_COMMANDS = ["train", "sft", "audit", "compare", "show"]


@pytest.mark.parametrize("command", FORCE_COMMANDS)
def test_force_refuses_a_folder_that_is_not_a_credo_output(tmp_path, capsys, saved_policy, command):
    out = tmp_path / "mine"
    (out / "final").mkdir(parents=True)
    (out / "final" / "thesis.tex").write_text("years of work")
    (out / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = snapshot(str(out))
    line = one_line_error(capsys, _force_argv(command, saved_policy, str(out)))
    assert f"--out {out} is not a credo output directory, and --force replaces only what credo wrote" in line
    assert "nothing was touched" in line
    assert snapshot(str(out)) == before


@pytest.mark.parametrize("command", FORCE_COMMANDS)
def test_force_refuses_the_home_directory(tmp_path, capsys, saved_policy, monkeypatch, command):
    """Even a home directory that looks like a credo output, with neither the working directory nor the cache in
    it (conftest puts the cache in pytest's base temporary directory)."""
    home = _audit_output(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    before = snapshot(str(home))
    line = one_line_error(capsys, _force_argv(command, saved_policy, str(home)))
    assert f"--out {home} is or holds the home directory, which --force would delete" in line
    assert snapshot(str(home)) == before


def test_force_refuses_what_holds_the_home_directory_the_current_directory_or_the_cache(tmp_path, monkeypatch):
    from credo.core.config import UserError
    from credo.core.outputs import claim_output
    outer = _audit_output(tmp_path / "outer")
    monkeypatch.setenv("HOME", str(outer / "home"))
    (outer / "home").mkdir()
    with pytest.raises(UserError, match="is or holds the home directory"):
        claim_output(str(outer), "audit", force=True)
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    monkeypatch.chdir(outer / "home")
    with pytest.raises(UserError, match="is or holds the current directory"):
        claim_output(str(outer), "audit", force=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CREDO_CACHE", str(outer / "home" / "cache"))
    with pytest.raises(UserError, match="is or holds credo's cache"):
        claim_output(str(outer), "audit", force=True)
    assert (outer / "audit.json").is_file() and (outer / "home").is_dir()


def test_force_refuses_the_root_and_mount_points(tmp_path, monkeypatch):
    from credo.core import outputs as runs
    from credo.core.config import UserError
    assert runs.replace_refusal("/") is not None
    if os.path.ismount("/proc"):  # a real mount point that holds neither the working directory nor the cache
        assert "is a file-system root or mount point" in runs.replace_refusal("/proc")
    disk = _audit_output(tmp_path / "disk")
    real_ismount = os.path.ismount
    monkeypatch.setattr(runs.os.path, "ismount", lambda p: p == str(disk) or real_ismount(p))
    with pytest.raises(UserError, match="is a file-system root or mount point, which --force never replaces"):
        runs.claim_output(str(disk), "audit", force=True)
    assert (disk / "audit.json").is_file()


def test_force_refuses_a_credo_output_holding_a_file_credo_did_not_write(tmp_path):
    from credo.core.config import UserError
    from credo.core.outputs import claim_output
    out = _audit_output(tmp_path / "audit")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="holds notes.txt, which credo did not write, beside a credo audit output"):
        claim_output(str(out), "train", force=True)
    assert (out / "notes.txt").read_text() == "mine"
    os.remove(out / "notes.txt")
    claim_output(str(out), "train", force=True)  # credo's own output alone: replaced
    assert sorted(os.listdir(out)) == [".credo-kind"]


# --- an --out inside another run ------------------------------------------------------------------------

@pytest.mark.parametrize("inside", ["checkpoints/step-000002/mine", "checkpoints/step-000002", "extra"])
def test_an_out_inside_another_run_or_its_checkpoint_is_refused_and_the_run_still_resumes(
        tmp_path, capsys, saved_policy, inside):
    from builders import killed_run
    run = tmp_path / "run"
    killed_run(saved_policy, str(run), stop_after=3)  # checkpoint at step 2
    before = snapshot(str(run))
    out = str(run / inside)
    line = one_line_error(capsys, ["audit", "--checkpoint", saved_policy, "--out", out, "--n", "4",
                                   "--group-size", "2", "--k-ref", "2", "--quiet"])
    where = f"the credo checkpoint {run}/checkpoints/step-000002" if inside.endswith("mine") else \
        f"the credo train output {run}"
    assert f"--out {out} lies inside {where}" in line and "nothing was touched" in line
    assert snapshot(str(run)) == before
    assert main(["train", "--resume", str(run), "--quiet"]) == 0


# --- what the checksums promise (docs/trust.md) ---------------------------------------------------------

def _drop_config_record(checkpoint: str) -> None:
    """What an edit can do that a manifest cannot catch: remove the config record, then re-make the manifest."""
    import json
    from credo.core.state_io import write_manifest
    path = os.path.join(checkpoint, "trainer_state.json")
    state = json.load(open(path))
    del state["config"]
    with open(path, "w") as f:
        json.dump(state, f)
    os.remove(os.path.join(checkpoint, "manifest.json"))
    write_manifest(checkpoint)


def test_a_checkpoint_without_its_config_record_is_refused_unless_accepted(tmp_path, capsys, saved_policy):
    from builders import killed_run
    run = str(tmp_path / "run")
    killed_run(saved_policy, run, stop_after=3)  # checkpoint at step 2
    checkpoint = os.path.join(run, "checkpoints", "step-000002")
    _drop_config_record(checkpoint)
    before = snapshot(run)
    line = one_line_error(capsys, ["train", "--resume", run, "--quiet"])
    assert f"{checkpoint}/trainer_state.json holds no record of the config it was trained with" in line
    assert f"pass --accept-unrecorded-checkpoint (credo train --resume {run} --accept-unrecorded-checkpoint)" in line
    assert snapshot(run) == before
    line = one_line_error(capsys, ["train", "--out", str(tmp_path / "new"), "--start", saved_policy,
                                   "--accept-unrecorded-checkpoint", "--quiet"])
    assert "--accept-unrecorded-checkpoint applies to --resume RUN_DIR only" in line
    assert main(["train", "--resume", run, "--accept-unrecorded-checkpoint", "--quiet"]) == 0
    assert os.path.isfile(os.path.join(run, "summary.json"))


def test_an_edited_audit_cache_entry_is_rebuilt_not_reused(tmp_path, capsys):
    import json
    from safetensors.torch import load_file, save_file
    from credo.lab.audit.cache import load_cached
    stem, problems, _, _ = audit_cache_entry(tmp_path)
    assert load_cached(stem, problems)["trace_tokens"] == 7.5  # untouched: reused
    meta = json.load(open(stem + ".json"))
    edited = {**meta, "trace_tokens": 99.0}  # a figure of the audit's cost table, edited
    json.dump(edited, open(stem + ".json", "w"))
    capsys.readouterr()
    assert load_cached(stem, problems) is None
    assert "does not hash to its recorded content" in capsys.readouterr().err
    json.dump(meta, open(stem + ".json", "w"))
    assert load_cached(stem, problems) is not None
    tensors = load_file(stem + ".safetensors")
    tensors["values.0"] = tensors["values.0"] + 1  # a reference value changed, the file still valid
    save_file(tensors, stem + ".safetensors")
    assert load_cached(stem, problems) is None
    stem, problems, _, _ = audit_cache_entry(tmp_path)
    older = {k: v for k, v in json.load(open(stem + ".json")).items() if k != "content_sha256"}
    json.dump(older, open(stem + ".json", "w"))  # from before the hash: rebuilt once
    assert load_cached(stem, problems) is None


def test_an_audit_rebuilds_an_edited_cache_entry_and_reports_what_it_measured(tmp_path, saved_policy, monkeypatch):
    import glob
    import json
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path / "cache"))  # this audit's entry alone (others share the session's)
    argv = ["audit", "--checkpoint", saved_policy, "--n", "4", "--group-size", "2", "--k-ref", "2", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    [entry] = glob.glob(os.path.join(os.environ["CREDO_CACHE"], "audit", "*.json"))
    meta = json.load(open(entry))
    meta["reference_cost"] = {k: v * 1000 for k, v in meta["reference_cost"].items()}  # the cost figures, edited
    json.dump(meta, open(entry, "w"))
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    first, second = (json.load(open(tmp_path / d / "audit.json"))["methods"]["mc_reference"] for d in ("a", "b"))
    for figure in ("tokens_scored_per_trace", "tokens_generated_per_trace", "cost_vs_grpo_step", "spearman"):
        assert second[figure] == first[figure]  # measured again, not the edited entry's x1000
    assert json.load(open(entry))["reference_cost"]["tokens_scored_per_trace"] == first["tokens_scored_per_trace"]
