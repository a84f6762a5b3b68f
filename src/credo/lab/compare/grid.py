"""The runs of a comparison, trained one after another or `jobs` at a time in worker processes: each run's result,
or the traceback of its failure (a full disk, a failing tracker or a dead worker stops the whole grid instead)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import torch
from tqdm import tqdm

from credo.core.config import ConfigError, UserError
from credo.core.disk_errors import DiskError, as_disk_error, is_disk_error
from credo.integrations.trackers import TrackingPlace
from credo.integrations.tracking import TrackerError
from credo.core.files import atomic_write_text
from credo.lab.compare.premises import needs_checks, out_dir_of, pending_path, premises_of_finished_run
from credo.lab.compare.presets import Preset, run_plan
from credo.lab.compare.runs import finished, progress_of, run_result, tokens_done
from credo.train.interrupts import (TaskWorkers, run_announced, worker_started, worker_task,
                                    workers_stopped_on_interrupt)
from credo.train.trainer import Trainer


def run_one(method: str, seed: int, preset: Preset, start: str, run_dir: str, on_step: Any,
            report_to: tuple[str, ...] = ()) -> dict[str, Any]:
    """Trains (or resumes) one run of the comparison, unless it finished earlier, and measures its premise checks
    (premises_of_finished_run); its result as results.json records it. report_to: the trackers it logs to, as a
    tracker run of its own named after its directory and grouped by the comparison (the stores under the
    comparison's --out: credo.integrations.tracking)."""
    if not finished(run_dir):  # else finished earlier: reuse (resumable)
        out_dir = out_dir_of(run_dir)
        place = TrackingPlace(root=out_dir, run_name=os.path.basename(run_dir), group=os.path.basename(out_dir))
        config, plan = run_plan(method, seed, preset, start, report_to)
        if needs_checks(method, preset):  # before summary.json exists: an export never sees it finished unchecked
            os.makedirs(os.path.dirname(pending_path(run_dir)), exist_ok=True)
            atomic_write_text(pending_path(run_dir), "premise checks not measured yet\n")
        Trainer(config, run_dir, progress=False, on_step=on_step, tracking=place, plan=plan).train()
        gc.collect()  # the trainer's policy and optimiser, before the checks load the final weights again
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    try:  # now, while its weights are here: an export carries the checks, never the weights
        premises_of_finished_run(method, seed, preset, start, run_dir)
    except Exception as err:  # noqa: BLE001 (the comparison's end measures it again and reports a failure)
        if is_disk_error(err):
            raise
        print(f"credo compare: the premise checks of {run_dir} failed ({type(err).__name__}: {err}); the "
              "comparison measures them again at its end", file=sys.stderr, flush=True)
    if os.path.exists(pending_path(run_dir)):
        os.remove(pending_path(run_dir))
    return run_result(run_dir)


UNTIL = re.compile(r"([01]?\d|2[0-3]):[0-5]\d")
"""compare --until: a time of day, HH:MM."""


def time_of_day(text: str, now: float | None = None) -> float | None:
    """'HH:MM' as the next such local time after `now` (seconds since the epoch; default: now); '' -> None; else a
    ConfigError naming compare --until. Around a change of clock an hour that is missing or repeated is taken as
    the C library resolves it (later rather than earlier)."""
    if not text:
        return None
    if not UNTIL.fullmatch(text):
        raise ConfigError(f"compare --until must be a time of day HH:MM (e.g. 13:05; in YAML or --set, quoted), "
                          f"got {text!r}")
    now = time.time() if now is None else now
    hours, minutes = (int(x) for x in text.split(":"))
    day = time.localtime(now)
    for days in (0, 1):  # today's, else tomorrow's (mktime carries a 32nd of the month into the next)
        at = time.mktime((day.tm_year, day.tm_mon, day.tm_mday + days, hours, minutes, 0, 0, 0, -1))
        if at > now:
            return at
    return at


def finished_first(plan: list[tuple[str, int, str]]) -> list[int]:
    """The order runs are queued in (plan indices): those that finished earlier first, then plan order. A finished
    run is only read back (and checked, if its premise checks are pending): it should not wait hours for a worker
    behind a run that trains, nor be missing meanwhile from the bar's count of finished runs."""
    done = [finished(run_dir) for _, _, run_dir in plan]
    return sorted(range(len(plan)), key=lambda i: not done[i])


def next_run(queued: list[int], seconds: list[float | None] | None, until: float | None) -> int:
    """Which of the queued runs (plan indices, as finished_first orders them) to start now: the first, unless
    `until` (a time, seconds since the epoch) is set and its estimate (`seconds` of each run of the plan) says it
    cannot finish by then; then the first one that can (a greedy choice, not the most runs; a run of a method the
    estimate could not cost, None, waits while any other fits); when none can, the first (its checkpoints keep
    what it trains, and it goes on where the comparison is resumed)."""
    if until is None or seconds is None:
        return queued[0]
    now = time.time()
    return next((i for i in queued if seconds[i] is not None and now + seconds[i] <= until), queued[0])


def _run_serial(plan: list[tuple[str, int, str]], preset: Preset, start: str, bar: tqdm,
                report_to: tuple[str, ...] = (), seconds: list[float | None] | None = None,
                until: float | None = None, ended: Callable[[int], None] = lambda i: None
                ) -> list[tuple[Any, str | None]]:
    outcomes: dict[int, tuple[Any, str | None]] = {}
    queued = finished_first(plan)
    while queued:
        index = next_run(queued, seconds, until)
        queued.remove(index)
        method, seed, run_dir = plan[index]
        state = {"tokens": tokens_done(run_dir, preset.token_budget)}  # already counted in the bar's start

        def on_step(trainer: Trainer, row: dict, method: str = method, seed: int = seed, state: dict = state) -> None:
            bar.update(min(row["tokens_generated"], preset.token_budget) - state["tokens"])
            state["tokens"] = min(row["tokens_generated"], preset.token_budget)
            bar.set_description(f"{method} seed {seed} step {row['step']}")
            if state["tokens"] >= preset.token_budget:  # what follows the last step: evaluation, premise checks
                bar.set_description(f"{method} seed {seed}: final evaluation and checks")

        try:
            outcomes[index] = (run_one(method, seed, preset, start, run_dir, on_step, report_to), None)
        except Exception as err:
            if is_disk_error(err):  # the machine's, not the method's: every later run would fail the same way
                raise as_disk_error(err) from err
            if isinstance(err, TrackerError):  # the same: a tracker fails every run, whatever its method
                raise
            outcomes[index] = (None, traceback.format_exc())
        bar.update(preset.token_budget - state["tokens"])
        ended(index)
    return [outcomes[i] for i in range(len(plan))]


def _worker(method: str, seed: int, preset: Preset, start: str, run_dir: str, threads: int,
            report_to: tuple[str, ...] = ()) -> tuple[Any, str | None]:
    torch.set_num_threads(threads)
    with worker_task():  # stopped by the parent (credo.train.interrupts): the run unwinds, then the worker leaves
        try:
            return run_one(method, seed, preset, start, run_dir, None, report_to), None
        except Exception as err:
            if is_disk_error(err):  # raised to the parent, which stops the grid (DiskError pickles from its parts)
                raise as_disk_error(err) from err
            if isinstance(err, TrackerError):  # the same (a tracker fails every run), and it pickles
                raise
            return None, traceback.format_exc()


def _executor(jobs: int, workers: TaskWorkers) -> Any:
    """The worker pool of _run_parallel: `jobs` spawned processes (no forked torch thread pools), each of which
    leaves when its parent stops it or is gone, and says which run it trains (credo.train.interrupts)."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=worker_started, initargs=(os.getpid(), workers.folder))


def worker_died(plan: list[tuple[str, int, str]], died: tuple[list[int], str]) -> UserError:
    """The one line of a comparison whose worker process died (the kernel's out-of-memory killer, `kill -9`):
    the run it trained and what ended it. No run has failed: the pool stopped the others, which resume."""
    runs = " or ".join(f"{plan[i][0]} seed {plan[i][1]} ({plan[i][2]})" for i in died[0])
    who = f"the worker process training {runs}" if runs else "a worker process, between runs,"
    return UserError(f"{who} was stopped by {died[1]} (the kernel's out-of-memory killer sends SIGKILL); no run "
                     "failed: the others were stopped at once and keep their last checkpoints; rerun the same "
                     "command to go on (finished runs are reused)")


def _run_parallel(plan: list[tuple[str, int, str]], preset: Preset, start: str, bar: tqdm, jobs: int,
                  report_to: tuple[str, ...] = (), seconds: list[float | None] | None = None,
                  until: float | None = None, ended: Callable[[int], None] = lambda i: None
                  ) -> list[tuple[Any, str | None]]:
    """Runs `plan` `jobs` at a time, in the order next_run gives (seconds, until). A run is submitted only when a
    worker is free: a process pool starts
    what it is handed ahead of time, so a full disk (DiskError) then stops the grid with no run begun after
    it; the runs already going are waited for (on that disk they fail at their next write), then it raises."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    outcomes: dict[int, tuple[Any, str | None]] = {}
    before = [tokens_done(run_dir, preset.token_budget) for _, _, run_dir in plan]  # the bar's start
    shown, queued, stop, broken = sum(before), finished_first(plan), None, []
    futures: dict[Any, int] = {}
    submitted: dict[int, float] = {}  # when each run was handed to a worker
    workers = TaskWorkers()  # where each task says which worker process runs it
    with _executor(jobs, workers) as pool, workers_stopped_on_interrupt():  # no worker trains on, holding its lock
        processes = getattr(pool, "_processes", {})  # pid -> Process; dropped at shutdown, when exit codes are known
        def submit_next() -> set[Any]:
            if not queued or broken:  # a broken pool takes no task: what is left resumes on the rerun
                return set()
            i = next_run(queued, seconds, until)
            method, seed, run_dir = plan[i]
            try:
                future = pool.submit(run_announced, i, _worker, method, seed, preset, start, run_dir, threads,
                                     report_to)
            except BrokenProcessPool:  # a worker died between runs: no run of its to name
                broken.append(-1)
                return set()
            queued.remove(i)
            futures[future], submitted[i] = i, time.time()
            return {future}
        pending: set[Any] = set()
        for _ in range(jobs):
            pending |= submit_next()
        while pending:
            done, pending = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
            workers.drain()
            for future in done:
                try:
                    outcomes[futures[future]] = future.result()
                except (DiskError, TrackerError) as err:
                    stop = stop or err
                    if pending:
                        why = "a tracker's failure" if isinstance(err, TrackerError) else "a refused write"
                        print(f"credo compare: stopping on {why}; waiting for {len(pending)} running run(s)",
                              file=sys.stderr, flush=True)
                except BrokenProcessPool:  # a worker died (killed, out of memory): stopped below, not a failure
                    broken.append(futures[future])
                if stop is None:
                    pending |= submit_next()
                if futures[future] in outcomes:  # after the next run is handed out: no worker waits for it
                    ended(futures[future])
            running = {futures[f]: submitted[futures[f]] for f in pending}
            shown = _show(bar, shown, plan, preset, before, outcomes, running)
    if broken:
        stop = stop or worker_died(plan, workers.died(processes, broken))
    if stop is not None:
        raise stop
    return [outcomes[i] for i in range(len(plan))]


def _show(bar: tqdm, shown: int, plan: list[tuple[str, int, str]], preset: Preset, before: list[int],
          outcomes: dict[int, Any], running: dict[int, float]) -> int:
    """Moves the bar from `shown` to the tokens the runs hold now (before[i] from the start, a finished run its
    budget, a running one its log's count) and names the running ones; returns where it now stands.
    running: {plan index: when it was handed to a worker}."""
    started = sorted((i, *_logged(plan[i][2], since, before[i], preset.token_budget)) for i, since in running.items())
    started = [row for row in started if row[2] > 0]  # a run that has logged no step here yet: as it was
    now = (sum(before) + sum(preset.token_budget - before[i] for i in outcomes)
           + sum(tokens - before[i] for i, tokens, _ in started))
    bar.update(now - shown)
    names = ", ".join(f"{plan[i][0]} seed {plan[i][1]} step {step}" for i, _, step in started)
    bar.set_description(f"{len(outcomes)}/{len(plan)} runs done" + (f"; running {names}" if names else ""))
    return now


def _logged(run_dir: str, since: float, held: int, budget: int) -> tuple[int, int]:
    """(tokens, step) of a running run; until its trainer has rewritten its log after `since` (cut back to the
    checkpoint it resumes from) the stale rows beyond that checkpoint do not count: (held, 0)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path) or os.path.getmtime(path) < since:
        return held, 0
    return progress_of(run_dir, budget)


def train_all(plan: list[tuple[str, int, str]], preset: Preset, start: str, jobs: int,
              progress: bool, report_to: tuple[str, ...] = (), seconds: list[float | None] | None = None,
              until: float | None = None, after_each: Callable[[], None] | None = None
              ) -> list[tuple[Any, str | None]]:
    """(result, None) or (None, traceback) of each run of `plan`, under one progress bar (closed even when a
    full disk stops the grid, so the error is not printed onto the bar's line). seconds/until: each run's estimate
    and the time by which the runs started should finish (next_run); None: plan order. after_each: called in this
    process once each run that had something left to do here (training, or its pending premise checks) has
    ended (compare.export_each), and once before any trains when some finished earlier (they may never have been
    exported); not after a run only read back."""
    bar = tqdm(total=len(plan) * preset.token_budget, unit="tok", unit_scale=True, disable=not progress,
               dynamic_ncols=True, initial=sum(tokens_done(run_dir, preset.token_budget) for _, _, run_dir in plan))
    settled = {i for i, (_, _, run_dir) in enumerate(plan) if finished(run_dir) and not os.path.exists(
        pending_path(run_dir))}
    def ended(index: int) -> None:
        if after_each is not None and index not in settled:
            after_each()
    if after_each is not None and settled:  # runs finished before (perhaps never exported): exported before any trains
        after_each()
    try:
        if jobs <= 1:
            return _run_serial(plan, preset, start, bar, report_to, seconds, until, ended)
        return _run_parallel(plan, preset, start, bar, jobs, report_to, seconds, until, ended)
    finally:
        bar.close()
