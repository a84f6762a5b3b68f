"""Ctrl-C, `kill` and a closed terminal: a command stops in one line, leaves nothing running, and can go on.

`credo train`, `credo compare` and `credo sft` turn SIGINT (Ctrl-C), SIGTERM (`kill PID`, `timeout`, a job
scheduler) and SIGHUP (a closed terminal) into `Interrupted`, a BaseException: it unwinds through every `finally`
and context manager, so a run's lock is released and a half-written checkpoint's temporary directory removed (the
last whole checkpoint stays the last one), and no `except Exception` takes it for a run's failure. The command then
says in one line where it stopped and how to go on, and exits 128 + the signal's number (130 for Ctrl-C).

A comparison's worker processes (`--jobs` > 1) are stopped by their parent (`stop_workers`): SIGTERM, then
SIGKILL after a grace period. A worker ignores SIGINT (a terminal's Ctrl-C reaches the whole foreground process
group; the parent decides), leaves on SIGTERM or SIGHUP after unwinding its run, and leaves by itself when its
parent is gone (killed with SIGKILL, which no process can handle), so it never trains on as an orphan that
holds its run's lock. A worker that dies by itself (the kernel's out-of-memory killer, `kill -9`) is named with
its task and the signal that ended it (TaskWorkers), and the comparison stops in one line.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from typing import Any, Iterator

from tqdm import tqdm

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WORKER_GRACE_SECONDS = 5.0
"""How long stop_workers waits for a worker to unwind after SIGTERM before it kills it."""


class Interrupted(BaseException):
    """A stop signal (STOP_SIGNALS) arrived; `message`, once a command has added it, says where it stopped and
    how to go on."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(message or signal.Signals(signum).name)
        self.signum, self.message = signum, message

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def explained(self, message: str) -> "Interrupted":
        return Interrupted(self.signum, message)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While inside (main thread only), each of STOP_SIGNALS raises Interrupted. Only the first does: a second
    Ctrl-C while the first unwinds would cut the unwinding short (a lock or a temporary directory left)."""
    raised: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if not raised:
            raised.append(signum)
            raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def stop_workers(grace: float = WORKER_GRACE_SECONDS) -> list[int]:
    """Stops this process's worker processes (its live multiprocessing children): SIGTERM to each, then SIGKILL
    to any still running after `grace` seconds. Returns their process ids."""
    children = multiprocessing.active_children()
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.is_alive():
            child.kill()
            child.join()
    return [child.pid for child in children]


@contextlib.contextmanager
def workers_stopped_on_interrupt() -> Iterator[None]:
    """Inside a worker pool's `with`: a stop signal (or a KeyboardInterrupt) stops the workers (stop_workers)
    before the pool's exit would wait for their runs to end."""
    try:
        yield
    except (Interrupted, KeyboardInterrupt):
        stop_workers()
        raise


_busy = False  # whether this worker is running a task (a stop then unwinds it) or waiting for one (it just leaves)


_announce: Any = None  # the parent's queue, on which each task tells which process runs it (run_announced)


class TaskWorkers:
    """Which worker process of a pool runs which task: each task, as it begins in a worker (run_announced), writes
    its process id to `folder`/<task index>; the folder, a plain path, is handed to worker_started. (A
    multiprocessing queue handed to the pool's initializer keeps the pool from ever seeing a killed worker: it
    waits forever.) A pool whose worker died fails every task it held with BrokenProcessPool, naming neither
    the task nor the cause; `died` finds both. The folder is removed with this object."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="credo-workers-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)
        self.pid_of: dict[int, int] = {}

    def drain(self) -> None:
        for name in os.listdir(self.folder):
            if name.isdigit():  # a finished announcement (written under a temporary name, then renamed)
                with contextlib.suppress(OSError, ValueError), open(os.path.join(self.folder, name)) as f:
                    self.pid_of[int(name)] = int(f.read())

    def died(self, processes: dict[int, Any], tasks: list[int]) -> tuple[list[int], str]:
        """Of `tasks` (their futures broken), the ones whose process died by a signal, and that signal's name;
        `processes` (pid -> multiprocessing Process, the pool's, joined). A worker the pool itself stopped
        after the death (SIGTERM, which its handler turns into exit status 143) is not one; when no process
        died by another signal, every task of `tasks` and how the first of them ended. A task index -1: a worker
        died between tasks."""
        self.drain()
        ended = {i: processes[self.pid_of[i]].exitcode for i in tasks if self.pid_of.get(i) in processes}
        killed = [i for i, code in ended.items() if code is not None and code < 0 and -code != signal.SIGTERM]
        chosen = killed or sorted(i for i in tasks if i >= 0)
        code = ended[chosen[0]] if chosen and chosen[0] in ended else next(
            (p.exitcode for p in processes.values() if (p.exitcode or 0) < 0), None)  # one idle between tasks
        if code is None:
            return chosen, "an unknown cause"
        number = -code if code < 0 else code - 128
        with contextlib.suppress(ValueError):
            return chosen, signal.Signals(number).name
        return chosen, f"exit status {code}"


def run_announced(index: int, fn: Any, *args: Any) -> Any:
    """In a worker: tell the parent (TaskWorkers) that this process runs task `index`, then run fn(*args)."""
    if _announce is not None:
        part = os.path.join(_announce, f".{index}-{os.getpid()}")
        with open(part, "w") as f:
            f.write(str(os.getpid()))
        os.replace(part, os.path.join(_announce, str(index)))
    return fn(*args)


def worker_started(parent_pid: int, announce: Any = None) -> None:
    """Initializer of a comparison's worker process (see the module docstring); `announce`: TaskWorkers' folder."""
    global _announce
    _announce = announce
    # tqdm's default lock is a multiprocessing semaphore, which a stopped worker (os._exit) would leave for the
    # resource tracker to report as leaked, on the parent's stderr; a worker's bars are off, a thread lock will do
    tqdm.set_lock(threading.RLock())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _worker_stop)
    threading.Thread(target=_leave_with_parent, args=(parent_pid,), daemon=True).start()


def _worker_stop(signum: int, frame: object) -> None:
    if _busy:
        raise Interrupted(signum)
    os._exit(128 + signum)


def _leave_with_parent(parent_pid: int, every: float = 1.0) -> None:
    """A daemon thread: once the parent is gone (this process was handed to another), stop as on SIGTERM."""
    while os.getppid() == parent_pid:
        time.sleep(every)
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def worker_task() -> Iterator[None]:
    """Around a worker's task: a stop signal unwinds it (its run's lock released, temporary files removed), then
    the worker leaves at once, quietly: the parent, which stopped it, reports the stop."""
    global _busy
    _busy = True
    try:
        yield
    except Interrupted as stop:
        os._exit(stop.exit_code)
    finally:
        _busy = False
