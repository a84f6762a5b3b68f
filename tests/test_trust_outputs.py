"""Trust, round two: what --out and --force may take, a run that died writing its first checkpoint, and what
the checksums promise (a checkpoint without its config record, an edited audit cache entry)."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys

import pytest

from credo.cli import main
from credo.disk_errors import as_disk_error, is_disk_error
from trust_helpers import FAST, one_line_error

FAST_SET = sum((["--set", s] for s in FAST), [])


# --- a run that died writing its first checkpoint -------------------------------------------------------

def _train_argv(start: str, out: str) -> list[str]:
    return ["train", "--method", "grpo", "--start", start, "--steps", "2", "--out", out, "--quiet", *FAST_SET]


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
    from trust_helpers import killed_run
    out = tmp_path / "run"
    killed_run(saved_policy, str(out), stop_after=1)  # step 1 of checkpoint_every=2: no checkpoint yet
    (out / "checkpoints" / ".tmp-step-000002-x1y2").mkdir(parents=True)  # what a killed first write leaves
    (out / "checkpoints" / ".tmp-step-000002-x1y2" / "model.safetensors").write_bytes(b"half")
    assert main(_train_argv(saved_policy, str(out))) == 0
    assert "never reached a checkpoint; replacing it" in capsys.readouterr().err
    assert sorted(os.listdir(out / "checkpoints")) == ["step-000002"]
