"""kill -9 at random points of a `credo train` process, then `--resume`: the final weights and the
metrics are bit-identical to a run that was never interrupted (CPU, one thread, same seed)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from builders import subprocess_env, logged_metrics, resume_run, steps_logged, train_command
from credo.policy import load_policy

FAMILY = {  # one method per family, with its cheapest settings
    "outcome": ("rloo", []),
    "rredcot": ("rredcot", []),
    "vineppo": ("vineppo", ["credit.k=2"]),
    "resets": ("srpo", ["reset.n_fresh=2", "reset.n_reset=2", "reset.localiser=random"]),
    "sc_grpo": ("sc_grpo", []),
    "ibpo": ("ibpo", []),
}


def kill_at_random_point(argv: list[str], run_dir: str, steps: int, rng: random.Random) -> int:
    """Start `argv`, wait until a random step is logged, kill -9 after a random extra delay. -> that step."""
    target = rng.randint(1, steps - 1)
    process = subprocess.Popen(argv, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while steps_logged(run_dir) < target and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    return target


def check_kill_resume(start: str, tmp_path, method: str, extra: list[str], steps: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
    done = subprocess.run(train_command(start, reference, method, steps, extra),
                          env=subprocess_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    argv = train_command(start, killed, method, steps, extra)
    for _ in range(kills):
        kill_at_random_point(argv, killed, steps, rng)
        argv = [sys.executable, "-m", "credo.cli", "train", "--resume", killed, "--quiet"]
    resume_run(killed)
    assert logged_metrics(killed) == logged_metrics(reference)
    a = load_policy(os.path.join(reference, "final")).model.state_dict()
    b = load_policy(os.path.join(killed, "final")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.load(open(os.path.join(killed, "summary.json")))["final_accuracy"] == \
        json.load(open(os.path.join(reference, "summary.json")))["final_accuracy"]


@pytest.mark.slow
def test_grpo_killed_at_a_random_point_resumes_bit_identical(saved_policy, tmp_path):
    check_kill_resume(saved_policy, tmp_path, "grpo", [], steps=4, kills=1,
                      seed=int(os.environ.get("CREDO_KILL_SEED", "0")))


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILY))
def test_every_family_killed_twice_resumes_bit_identical(family, saved_policy, tmp_path):
    method, extra = FAMILY[family]
    check_kill_resume(saved_policy, tmp_path, method, extra, steps=6, kills=2, seed=sorted(FAMILY).index(family))
