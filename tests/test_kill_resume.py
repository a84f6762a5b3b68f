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

from credo.policy import load_policy

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SETTINGS = ["eval_n=2", "final_eval_n=4", "eval_every=2", "checkpoint_every=1", "keep_checkpoints=2",
            "prompts_per_step=2", "group_size=3", "sampling.max_new_tokens=12", "lr=1e-3"]
FAMILY = {  # one method per family, with its cheapest settings
    "outcome": ("rloo", []),
    "rredcot": ("rredcot", []),
    "vineppo": ("vineppo", ["credit.k=2"]),
    "resets": ("srpo", ["reset.n_fresh=2", "reset.n_reset=2", "reset.localiser=random"]),
    "sc_grpo": ("sc_grpo", []),
    "ibpo": ("ibpo", []),
}


def command(start: str, out: str, method: str, steps: int, extra: list[str]) -> list[str]:
    sets = sum((["--set", s] for s in SETTINGS + extra), [])
    return [sys.executable, "-m", "credo.cli", "train", "--method", method, "--start", start, "--steps", str(steps),
            "--out", out, "--quiet", *sets]


def steps_logged(run_dir: str) -> int:
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.endswith("\n")) - 1
    except FileNotFoundError:
        return -1


def kill_at_random_point(argv: list[str], run_dir: str, steps: int, rng: random.Random) -> int:
    """Start `argv`, wait until a random step is logged, kill -9 after a random extra delay. -> that step."""
    target = rng.randint(1, steps - 1)
    process = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while steps_logged(run_dir) < target and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    return target


def resume(run_dir: str) -> None:
    done = subprocess.run([sys.executable, "-m", "credo.cli", "train", "--resume", run_dir, "--quiet"], env=ENV,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def metrics(run_dir: str) -> list[dict]:
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def check_kill_resume(start: str, tmp_path, method: str, extra: list[str], steps: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
    done = subprocess.run(command(start, reference, method, steps, extra), env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    argv = command(start, killed, method, steps, extra)
    for _ in range(kills):
        kill_at_random_point(argv, killed, steps, rng)
        argv = [sys.executable, "-m", "credo.cli", "train", "--resume", killed, "--quiet"]
    resume(killed)
    assert metrics(killed) == metrics(reference)
    a = load_policy(os.path.join(reference, "final")).model.state_dict()
    b = load_policy(os.path.join(killed, "final")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.load(open(os.path.join(killed, "summary.json")))["final_accuracy"] == \
        json.load(open(os.path.join(reference, "summary.json")))["final_accuracy"]


def test_grpo_killed_at_a_random_point_resumes_bit_identical(saved_policy, tmp_path):
    check_kill_resume(saved_policy, tmp_path, "grpo", [], steps=4, kills=1, seed=int(os.environ.get("CREDO_KILL_SEED", "0")))


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILY))
def test_every_family_killed_twice_resumes_bit_identical(family, saved_policy, tmp_path):
    method, extra = FAMILY[family]
    check_kill_resume(saved_policy, tmp_path, method, extra, steps=6, kills=2, seed=sorted(FAMILY).index(family))
