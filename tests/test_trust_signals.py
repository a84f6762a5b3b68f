"""Ctrl-C, `kill` and a closed terminal: one line, exit 128 + the signal, no process left
behind holding a run's lock, and the same command (or --resume) goes on bit-identically."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import credo.lab.compare.grid as cmp
import sleepy_worker
from credo.cli.main import main
from credo.core.config import UserError
from credo.lab.compare.presets import resolve_preset
from credo.train.interrupts import Interrupted, signals_raise
from credo.policy import load_policy
from credo.core.outputs import is_locked
from credo.train.trainer import Trainer
from builders import subprocess_env, TRUST_FAST_SET, logged_metrics, resume_run, steps_logged, train_command



def _pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by whoever adopted it, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` now (Linux /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _gone_within(pids: set[int], seconds: float) -> set[int]:
    """The processes of `pids` still running after `seconds` (at most)."""
    deadline = time.time() + seconds
    while time.time() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if _pid_alive(p)}


# --- the mechanism, fast: a stop signal in the parent stops its workers and frees their locks -------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_stops_the_comparisons_worker_processes_and_frees_their_locks(tmp_path, monkeypatch,
                                                                                      saved_policy, signum):
    """Real spawned worker processes (credo's pool, initializer and signal handling), each holding its run's
    lock and training until stopped; a signal to the parent: Interrupted, and within 10 s no worker is left and
    no lock is held. Before the fix, the workers trained on (and a rerun found every run locked)."""
    monkeypatch.setattr(cmp, "_worker", sleepy_worker.train_forever)
    preset = resolve_preset("smoke", ("rloo",), (0,), None, None)
    plan = [(m, s, str(tmp_path / f"{m}-{s}")) for s in preset.seeds for m in preset.methods]
    for _, _, run_dir in plan:
        os.makedirs(run_dir)
    started: list[int] = []
    returned = threading.Event()
    hung: list[bool] = []

    def signal_once_both_train() -> None:
        deadline = time.time() + 120
        while len(started) < 2 and time.time() < deadline:
            started[:] = [int(f.split("-")[1]) for _, _, d in plan for f in os.listdir(d) if f.startswith("started-")]
            time.sleep(0.05)
        os.kill(os.getpid(), signum)
        if not returned.wait(30):  # (before the fix) the pool's exit waited for runs that never end: free it
            hung.append(True)
            for pid in started:
                os.kill(pid, signal.SIGKILL)

    threading.Thread(target=signal_once_both_train, daemon=True).start()
    with pytest.raises(Interrupted) as stopped:
        with signals_raise():
            cmp._run_parallel(plan, preset, saved_policy, cmp.tqdm(disable=True), jobs=2)
    returned.set()
    assert not hung, "the comparison waited for its workers' runs instead of stopping them"
    assert stopped.value.signum == signum and len(started) == 2
    assert not _gone_within(set(started), 10.0)
    assert not any(is_locked(run_dir) for _, _, run_dir in plan)


def test_a_worker_leaves_once_its_parent_is_gone(tmp_path):
    """The parent killed with SIGKILL (no handler runs): its worker notices within seconds and stops."""
    script = ("import multiprocessing, os, sys, time\n"
              "from concurrent.futures import ProcessPoolExecutor\n"
              "import sleepy_worker\n"
              "from credo.train.interrupts import worker_started\n"
              "if __name__ == '__main__':\n"
              "    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'),\n"
              "                               initializer=worker_started, initargs=(os.getpid(),))\n"
              f"    pool.submit(sleepy_worker.train_forever, 'grpo', 0, None, '', {str(tmp_path)!r}, 1)\n"
              "    time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.time() + 120
    while not [f for f in os.listdir(tmp_path) if f.startswith("started-")] and time.time() < deadline:
        time.sleep(0.1)
    worker = int(next(f for f in os.listdir(tmp_path) if f.startswith("started-")).split("-")[1])
    parent.kill()
    parent.wait()
    left = _gone_within({worker}, 10.0)
    if left:  # an orphan (before the fix): stopped here, not left training after the test
        os.kill(worker, signal.SIGKILL)
    assert not left, "the worker trained on after its parent was killed"
    assert not is_locked(str(tmp_path))


@pytest.mark.slow  # alone it passes in seconds; after this file's earlier tests, in one process, the pool never
# saw the death on this 2-core machine (2026-12-06) and the test waited forever; CI's suite must not hang
def test_a_killed_worker_stops_the_comparison_naming_its_run_and_signal(tmp_path, monkeypatch, saved_policy):
    """Two real spawned workers, each holding its run's lock; one is killed with SIGKILL (what the kernel's
    out-of-memory killer sends): one stop naming that run and the signal, no run recorded as failed, and within
    10 s no worker is left and no lock is held. Before, every run came back as a BrokenProcessPool failure."""
    monkeypatch.setattr(cmp, "_worker", sleepy_worker.train_forever)
    preset = resolve_preset("smoke", ("rloo",), (0,), None, None)
    plan = [(m, s, str(tmp_path / f"{m}-{s}")) for s in preset.seeds for m in preset.methods]
    for _, _, run_dir in plan:
        os.makedirs(run_dir)
    pids: dict[str, int] = {}

    def kill_the_second_once_both_train() -> None:
        deadline = time.time() + 120
        while len(pids) < 2 and time.time() < deadline:
            pids.update({d: int(f.split("-")[1]) for _, _, d in plan for f in os.listdir(d) if f.startswith("started")})
            time.sleep(0.05)
        os.kill(pids[plan[1][2]], signal.SIGKILL)

    threading.Thread(target=kill_the_second_once_both_train, daemon=True).start()
    with pytest.raises(UserError) as stopped:
        cmp._run_parallel(plan, preset, saved_policy, cmp.tqdm(disable=True), jobs=2)
    line = str(stopped.value)
    assert f"training {plan[1][0]} seed 0 ({plan[1][2]}) was stopped by SIGKILL" in line, line
    assert plan[0][2] not in line and "\n" not in line and "no run failed" in line
    assert not _gone_within(set(pids.values()), 10.0)
    assert not any(is_locked(run_dir) for _, _, run_dir in plan)


# --- Ctrl-C in `credo train`: one line, exit 130, the resume bit-identical ------------------------------

def _train_argv(start: str, out: str) -> list[str]:
    return ["train", "--method", "grpo", "--start", start, "--steps", "4", "--out", out, "--quiet", *TRUST_FAST_SET]


def _main_not_raising(argv: list[str]) -> int:
    try:
        return main(argv)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the command as a KeyboardInterrupt (a traceback, not one line)")


def test_ctrl_c_in_train_is_one_line_exit_130_and_the_resume_is_bit_identical(tmp_path, capsys, saved_policy,
                                                                               monkeypatch):
    reference, run = str(tmp_path / "reference"), str(tmp_path / "run")
    assert main(_train_argv(saved_policy, reference)) == 0
    record = Trainer.record

    def ctrl_c_during_step_3(self, *args, **kwargs):
        if self.step == 3:  # step 3's update is done, its row not yet logged: the checkpoint is step 2's
            os.kill(os.getpid(), signal.SIGINT)
        return record(self, *args, **kwargs)
    monkeypatch.setattr(Trainer, "record", ctrl_c_during_step_3)
    capsys.readouterr()
    assert _main_not_raising(_train_argv(saved_policy, run)) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"credo train: interrupted at step 3 of 4; the last checkpoint is step 2; resume with "
                   f"`credo train --resume {run}`"]
    assert not is_locked(run)
    monkeypatch.setattr(Trainer, "record", record)
    assert main(["train", "--resume", run, "--quiet"]) == 0
    assert logged_metrics(run) == logged_metrics(reference)
    a = load_policy(os.path.join(reference, "final")).model.state_dict()
    b = load_policy(os.path.join(run, "final")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_before_the_first_checkpoint_says_to_run_the_same_command_again(tmp_path, capsys, saved_policy,
                                                                               monkeypatch):
    run = str(tmp_path / "run")
    record = Trainer.record

    def ctrl_c_during_step_1(self, *args, **kwargs):
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return record(self, *args, **kwargs)
    monkeypatch.setattr(Trainer, "record", ctrl_c_during_step_1)
    capsys.readouterr()
    assert _main_not_raising(_train_argv(saved_policy, run)) == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        f"credo train: interrupted at step 1 of 4, before the first checkpoint; run the same command again to start "
        f"it over (or `credo train --resume {run}`)"]
    monkeypatch.setattr(Trainer, "record", record)
    assert main(_train_argv(saved_policy, run)) == 0


@pytest.mark.slow
def test_ctrl_c_at_a_random_moment_of_a_train_process_resumes_bit_identical(tmp_path, saved_policy):
    """A real process, a real SIGINT at a random moment after the first checkpoint: exit 130, one line, no
    traceback; --resume then ends bit-identical to a run never interrupted."""
    import random
    rng = random.Random(int(os.environ.get("CREDO_KILL_SEED", "0")))
    reference, run = str(tmp_path / "reference"), str(tmp_path / "run")
    done = subprocess.run(train_command(saved_policy, reference, "grpo", 6, []),
                          env=subprocess_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    process = subprocess.Popen(train_command(saved_policy, run, "grpo", 6, []), env=subprocess_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    target, deadline = rng.randint(2, 5), time.time() + 300
    while steps_logged(run) < target and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    process.send_signal(signal.SIGINT)
    err = process.communicate()[1].strip().splitlines()
    assert process.returncode == 130, err
    assert len(err) == 1 and err[0].startswith("credo train: interrupted at step ") and "Traceback" not in err[0]
    assert f"resume with `credo train --resume {run}`" in err[0]
    resume_run(run)
    assert logged_metrics(run) == logged_metrics(reference)
    a = load_policy(os.path.join(reference, "final")).model.state_dict()
    b = load_policy(os.path.join(run, "final")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- a whole comparison stopped: nothing left running, and the same command finishes it -----------------

def _compare_argv(start: str, out: str) -> list[str]:
    # the smoke preset with a budget its runs take seconds to spend: the stop lands while they train
    return [sys.executable, "-m", "credo.cli", "compare", "--preset", "smoke", "--start", start, "--out", out,
            "--jobs", "2", "--budget", "15000", "--quiet"]


def _training_steps(out: str) -> int:
    total = 0
    for name in ("grpo-s0", "rredcot-s0"):
        try:
            with open(os.path.join(out, "runs", name, "metrics.jsonl")) as f:
                total += min(2, sum(1 for line in f if line.endswith("\n")))  # step 0's row and a trained step
        except FileNotFoundError:
            continue
    return total


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to the parent", "SIGHUP to the parent", "SIGINT to the process group"])
def test_a_stopped_comparison_leaves_no_process_and_the_same_command_finishes_it(tmp_path, saved_policy, how):
    out = str(tmp_path / "cmp")
    argv = _compare_argv(saved_policy, out)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # its own process group, as a terminal's foreground job
    family, deadline = set(), time.time() + 600
    while _training_steps(out) < 4 and process.poll() is None and time.time() < deadline:
        family |= _descendants(process.pid)
        time.sleep(0.1)
    family |= _descendants(process.pid)
    assert process.poll() is None and len(family) >= 2, "both runs should be training in worker processes"
    name = how.split()[0]
    if how.endswith("group"):
        os.killpg(process.pid, getattr(signal, name))  # what a terminal's Ctrl-C does
    else:
        process.send_signal(getattr(signal, name))
    left = _gone_within(family | {process.pid}, 10.0)
    assert not left, f"still running 10 s after {how}: {left}"
    err = process.communicate()[1].strip().splitlines()
    assert process.returncode == 128 + getattr(signal, name)
    stop = [line for line in err if "estimated wall time" not in line]
    assert len(stop) == 1 and stop[0].startswith(f"credo compare: stopped by {name}: "), err
    assert f"rerun `credo compare --preset smoke --start {saved_policy} --out {out}" in stop[0]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)  # the same command
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.load(open(os.path.join(out, "results.json")))
    assert results["failures"] == {}
    assert sorted(results["methods"]) == ["grpo", "rredcot"]
    assert all(results["methods"][m]["seeds"]["0"]["tokens_generated"] >= 15000 for m in ("grpo", "rredcot"))


@pytest.mark.slow
def test_kill_9_of_one_comparison_worker_is_one_line_and_the_rerun_is_bit_identical(tmp_path, saved_policy):
    """What the kernel's out-of-memory killer does: SIGKILL to one worker while both train. One line naming that
    run and SIGKILL, exit 2, no failure-*.txt; the same command then finishes both runs with the logs (but their
    clocks) of a comparison never interrupted."""
    from builders import strip_time
    reference, out = str(tmp_path / "reference"), str(tmp_path / "cmp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(_compare_argv(saved_policy, reference), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    argv = _compare_argv(saved_policy, out)
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while _training_steps(out) < 4 and process.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    workers = sorted(_descendants(process.pid))
    held = {}  # worker pid -> the run whose lock it holds (from /proc/<pid>/fd)
    for pid in workers:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.endswith(".credo-lock"):
                    held[pid] = os.path.basename(os.path.dirname(target))
    victim = next(pid for pid, run in held.items() if run == "rredcot-s0")
    os.kill(victim, signal.SIGKILL)
    err = process.communicate(timeout=120)[1].strip().splitlines()
    assert process.returncode == 2, err
    lines = [line for line in err if "estimated wall time" not in line]
    assert len(lines) == 1 and lines[0].startswith("credo compare: error: the worker process training rredcot seed 0 "
                                                   f"({out}/runs/rredcot-s0) was stopped by SIGKILL"), err
    assert not [f for f in os.listdir(out) if f.startswith("failure-")]
    assert not _gone_within(set(workers), 10.0)
    done = subprocess.run(argv, env=env, capture_output=True, text=True)  # the same command
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.load(open(os.path.join(out, "results.json")))["failures"] == {}
    for name in ("grpo-s0", "rredcot-s0"):
        assert (strip_time(logged_metrics(os.path.join(out, "runs", name)))
                == strip_time(logged_metrics(os.path.join(reference, "runs", name)))), name
