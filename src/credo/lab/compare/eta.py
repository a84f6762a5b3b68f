"""How long a comparison will take, measured before it starts, and the confirmation asked above an hour.

Before training, `credo compare` times one training step of each method (from the comparison's own
config: same start, task, budget and schedule) and one curve evaluation, in a scratch directory it removes
afterwards; those steps are discarded, never reused by the runs. A method that already has finished or
part-way runs in the comparison (a resumed one) is not timed: their own clocks (stalled steps left out; finished
runs rather than part-way ones) give its seconds and generated tokens per step: runs, with their drift in
completion length and two jobs sharing the cores, say what its remaining runs will cost better than one first
step timed alone. Nor does a resumed comparison time again what an earlier start of it timed with as many jobs
(estimate.json: each method's step, and the evaluation of as many problems). The estimate of a run is

    steps = ceil(remaining budget / generated tokens of the timed step)
    seconds = steps x seconds of the timed step + evaluations x seconds of one evaluation

and the comparison's is the sum over the runs still to do, divided by the jobs run at once, plus the start
audit and the premise checks (after_training_seconds: their completions at the timed evaluation's cost per
completion; each run's checks are measured as it finishes, the start's at the end, and all are counted as if
measured after training). It is rough: step cost drifts as completions lengthen or shorten, and two jobs
slow each other a little.

Above an hour the comparison starts only when confirmed: `--yes`, or "y" at the prompt when stdin is a
terminal. A non-interactive run (a script, nohup, CI) above an hour without `--yes` is refused with one
line saying so, so that nobody starts hours of work on a shared machine by accident.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tqdm import tqdm

from credo.core.config import ConfigError, UserError
from credo.core.files import atomic_write_json
from credo.core.records import COUNT, SECONDS, number
from credo.lab.audit.premises import premises_of
from credo.lab.compare.premises import pending_path
from credo.lab.compare.presets import Preset, run_config
from credo.lab.compare.runs import clock_so_far, run_result, tokens_done
from credo.lab.compare.runs import finished as finished_run
from credo.tasks import make_task
from credo.train.trainer import Trainer


HOUR = 3600.0
ESTIMATE_FILE = "estimate.json"
"""The estimate a comparison made when it (last) started, in its --out; `estimate()`'s dict."""


@dataclass(frozen=True)
class Timing:
    """One method's measured cost: seconds and generated tokens of one training step."""

    seconds_per_step: float
    tokens_per_step: int


def measured_timing(runs: list[dict[str, Any]]) -> Timing | None:
    """A method's cost per step from its runs (compare.run_result dicts, or runs.clock_so_far ones of part-way
    runs): their own clocks, stalled steps left out, over their steps; None without a run or a step."""
    steps = sum(r["steps"] for r in runs)
    if not runs or steps <= 0:
        return None
    return Timing(sum(r["seconds"] for r in runs) / steps,
                  max(int(sum(r["tokens_generated"] for r in runs) / steps), 1))


def timing_from_runs(finished: list[dict[str, Any]], part_way: list[dict[str, Any]]) -> tuple[Timing, str] | None:
    """(Timing, 'finished runs' | 'part-way runs'): a method's cost per step from its finished runs' clocks, or
    else from the steps its part-way runs have logged (runs.clock_so_far); None with neither."""
    for source, runs in (("finished runs", finished), ("part-way runs", part_way)):
        if (timing := measured_timing(runs)) is not None:
            return timing, source
    return None


def _read_per_method(out_dir: str) -> dict[str, dict[str, Any]]:
    """ESTIMATE_FILE's per_method ({} where there is none, as for a comparison started before credo wrote it);
    a malformed file is an error naming it."""
    path = os.path.join(out_dir, ESTIMATE_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            per_method = json.load(f)["per_method"]
        for t in per_method.values():
            _timing(t)  # a malformed entry is refused here, not where it is used
        return per_method
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConfigError(f"{path} is not a credo estimate ({type(error).__name__}: {error}); remove it to go on")


def timed_steps(out_dir: str) -> dict[str, tuple[Timing, str]]:
    """{spec: (Timing, where it came from: 'one timed step', 'finished runs' or 'part-way runs')} kept in a
    comparison's ESTIMATE_FILE."""
    return {spec: (_timing(t), str(t.get("from", ""))) for spec, t in _read_per_method(out_dir).items()}


def _timing(entry: dict[str, Any]) -> Timing:
    """One per_method entry of estimate()'s dict as a Timing."""
    return Timing(number(entry["seconds_per_step"], "seconds_per_step", SECONDS),
                  max(int(number(entry["tokens_per_step"], "tokens_per_step", COUNT)), 1))


def keep_estimate(out_dir: str, estimate_: dict[str, Any]) -> None:
    """Writes `estimate_` (estimate()'s dict) as out_dir's ESTIMATE_FILE, keeping the per-method costs an
    earlier start recorded for methods this one did not time (a resume with fewer --methods, or one whose
    timing step failed), so --status can still cost them."""
    per_method = {**_read_per_method(out_dir), **estimate_["per_method"]}
    atomic_write_json(os.path.join(out_dir, ESTIMATE_FILE), {**estimate_, "per_method": per_method})


def _evaluation_seconds(trainer: Any) -> float:
    began = time.perf_counter()
    trainer.evaluate(trainer.config.eval_n)
    return time.perf_counter() - began


def time_evaluation(config: Any, threads: int | None = None) -> float:
    """Seconds of one curve evaluation of `config`'s start (every method evaluates the same model on the same
    problems), from a trainer in a scratch directory removed afterwards; threads as in time_methods. 0.0 when
    it fails: the runs then fail the same way and are reported, as in time_methods."""

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    scratch = tempfile.mkdtemp(prefix="credo-timing-")
    try:
        return _evaluation_seconds(Trainer(config, os.path.join(scratch, "run"), progress=False))
    except Exception:
        return 0.0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        torch.set_num_threads(before)


def time_methods(specs: list[tuple[str, int]], config_for: Callable[[str, int], Any],
                 threads: int | None = None, progress: bool = False,
                 eval_seconds: float = 0.0) -> tuple[dict[str, Timing], float]:
    """({spec: Timing} of one step of each (spec, seed), seconds of one curve evaluation); a method whose
    step fails has no Timing (its runs fail the same way and are reported as failures). The trainers
    live in a temporary directory, removed afterwards (nothing is written to the comparison's own).
    threads: torch threads while timing (those a worker process of the comparison gets); eval_seconds: an
    evaluation already timed (then none is timed again)."""

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    scratch = tempfile.mkdtemp(prefix="credo-timing-")
    timings: dict[str, Timing] = {}
    try:
        for i, (spec, seed) in enumerate(tqdm(specs, desc="timing one step of each method", disable=not progress,
                                              dynamic_ncols=True)):
            try:
                config = config_for(spec, seed)
                trainer = Trainer(config, os.path.join(scratch, f"run-{i}"), progress=False)
                if not eval_seconds:  # evaluation costs the same for every method (same model, same problems)
                    eval_seconds = _evaluation_seconds(trainer)
                began = time.perf_counter()
                row = trainer.train_step()
                timings[spec] = Timing(time.perf_counter() - began, max(int(row["tokens_generated"]), 1))
            except Exception:  # its runs will fail the same way and be reported; the estimate leaves it out
                continue
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        torch.set_num_threads(before)
    return timings, eval_seconds


def run_seconds(timing: Timing, tokens_left: int, eval_every_tokens: int, eval_seconds: float,
                final_eval_ratio: float) -> float:
    """Estimated seconds to finish one run: its remaining steps, its curve evaluations (one per crossing of
    eval_every_tokens, one at the start) and the final evaluation (final_eval_n / eval_n of a curve one)."""
    if tokens_left <= 0:
        return 0.0
    steps = math.ceil(tokens_left / timing.tokens_per_step)
    return steps * timing.seconds_per_step + evaluation_seconds(tokens_left, eval_every_tokens, eval_seconds,
                                                                final_eval_ratio)


def evaluation_seconds(tokens_left: int, eval_every_tokens: int, eval_seconds: float,
                       final_eval_ratio: float) -> float:
    """Seconds of the evaluations a run with tokens_left to generate still makes (run_seconds' share of them)."""
    if tokens_left <= 0:
        return 0.0
    evaluations = tokens_left // max(eval_every_tokens, 1) + 1
    return evaluations * eval_seconds + final_eval_ratio * eval_seconds


def estimate(pending: list[tuple[str, int]], timings: dict[str, Timing], eval_seconds: float, *,
             eval_every_tokens: int, final_eval_ratio: float, jobs: int,
             measured: dict[str, str] | None = None) -> dict[str, Any]:
    """{seconds, jobs, runs, per_method: {spec: {seconds_per_step, tokens_per_step, run_seconds, from}}, untimed}
    for the (spec, tokens left) runs still to do; seconds is the wall-clock estimate with `jobs` at once;
    untimed: the methods whose timing step failed (left out of the estimate); measured: {spec: where its Timing
    came from ('finished runs', 'part-way runs')} for those not timed (`from` says which)."""
    total, measured = 0.0, measured or {}
    per_method: dict[str, Any] = {}
    untimed = sorted({spec for spec, _ in pending if spec not in timings})
    for spec, tokens_left in pending:
        if spec in untimed:
            continue
        t = timings[spec]
        seconds = run_seconds(t, tokens_left, eval_every_tokens, eval_seconds, final_eval_ratio)
        total += seconds
        per_method.setdefault(spec, {"seconds_per_step": round(t.seconds_per_step, 4),
                                     "tokens_per_step": t.tokens_per_step, "run_seconds": 0.0,
                                     "from": measured.get(spec, "one timed step")})
        per_method[spec]["run_seconds"] = round(per_method[spec]["run_seconds"] + seconds, 1)
    parallel = max(1, min(jobs, len(pending)))
    return {"seconds": total / parallel, "jobs": jobs, "runs": len(pending), "eval_seconds": round(eval_seconds, 3),
            "per_method": per_method, "untimed": untimed}


def describe(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 2 * HOUR else f"{seconds / HOUR:.1f} h"


def confirm(estimate_seconds: float, *, yes: bool, interactive: bool, ask: Callable[[str], str] = input,
            say: Callable[[str], None] | None = None) -> None:
    """Prints the estimate; above an hour, returns only if confirmed (yes, or 'y' typed when interactive).
    Raises ConfigError (the CLI's one-line exit 2) otherwise."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    say(f"credo compare: estimated wall time {describe(estimate_seconds)}")
    if estimate_seconds <= HOUR or yes:
        return
    if interactive:
        answer = ask(f"This comparison will take about {describe(estimate_seconds)}. Start it? [y/N] ")
        if answer.strip().lower() in ("y", "yes"):
            return
        raise ConfigError("not started (answered no); pass --yes to start without asking")
    raise ConfigError(f"estimated wall time {describe(estimate_seconds)} is over an hour: pass --yes to start it")


def recorded_eval_seconds(out_dir: str, eval_n: int, jobs: int) -> float:
    """Seconds of one curve evaluation of eval_n problems as an earlier start of the comparison in out_dir timed
    it (its ESTIMATE_FILE) with as many jobs (so as many threads each); 0.0 where there is none, or it was of
    another number of problems or jobs. (Another start or task would be another comparison: its runs are
    refused by compare's reuse check.)"""
    path = os.path.join(out_dir, ESTIMATE_FILE)
    if not os.path.isfile(path):
        return 0.0
    _read_per_method(out_dir)  # a malformed file is refused, naming it
    with open(path) as f:
        recorded = json.load(f)
    if recorded.get("eval_n") != eval_n or recorded.get("jobs") != jobs:
        return 0.0
    return number(recorded.get("eval_seconds", 0.0), f"{path}: eval_seconds", SECONDS)


def recorded_steps(out_dir: str, jobs: int) -> dict[str, tuple[Timing, str]]:
    """timed_steps of an earlier start of the comparison in out_dir made with as many jobs (so as many threads
    each); {} where there is none or it ran another number of jobs. A resumed comparison then times no method
    again that it has timed once (a step of a SmolLM2 method on a CPU takes up to a minute)."""
    path = os.path.join(out_dir, ESTIMATE_FILE)
    if not os.path.isfile(path):
        return {}
    steps = timed_steps(out_dir)  # a malformed file is refused, naming it
    with open(path) as f:
        return steps if json.load(f).get("jobs") == jobs else {}


def measured_timings(plan: list[tuple[str, int, str]]) -> dict[str, tuple[Timing, str]]:
    """{spec: (Timing, 'finished runs' | 'part-way runs')}: each method's cost per step from its finished runs'
    clocks, or else from the steps its part-way runs have logged (a resumed comparison's runs say what a step of
    the method costs better than one step timed alone); specs with neither are left out."""
    finished: dict[str, list[dict[str, Any]]] = {}
    part_way: dict[str, list[dict[str, Any]]] = {}
    for spec, _, run_dir in plan:
        if finished_run(run_dir):
            finished.setdefault(spec, []).append(run_result(run_dir))
        else:
            try:
                clock = clock_so_far(os.path.join(run_dir, "metrics.jsonl"))
            except UserError:  # a damaged log: the run's own resume names it; here the method is timed instead
                clock = None
            if clock is not None:
                part_way.setdefault(spec, []).append(clock)
    timings = {spec: timing_from_runs(finished.get(spec, []), part_way.get(spec, []))
               for spec in {*finished, *part_way}}
    return {spec: timing for spec, timing in timings.items() if timing is not None}


def run_estimates(plan: list[tuple[str, int, str]], preset: Preset, estimate: dict[str, Any]) -> list[float | None]:
    """Each run's estimated seconds to its end from the comparison's `estimate` (its methods' steps and one
    evaluation): 0 for a finished run, None for a method it could not cost (untimed)."""
    per_method, out = estimate.get("per_method", {}), []
    for spec, _, run_dir in plan:
        left, t = preset.token_budget - tokens_done(run_dir, preset.token_budget), per_method.get(spec)
        checks = premise_check_seconds(preset, spec, estimate.get("eval_seconds", 0.0))
        if left <= 0:
            out.append(checks if os.path.exists(pending_path(run_dir)) else 0.0)
        else:
            out.append(None if t is None else checks + run_seconds(
                _timing(t), left, preset.eval_every_tokens, estimate.get("eval_seconds", 0.0),
                preset.final_eval_n / max(preset.eval_n, 1)))
    return out


def premise_check_seconds(preset: Preset, spec: str, eval_seconds: float) -> float:
    """Seconds of the premise checks of one run of `spec` (measured as it finishes:
    compare.premises.premises_of_finished_run), at eval_seconds per curve evaluation of preset.eval_n problems:
    premise_n completions, twice where a localiser replies to each; 0 for a method that rests on no premise."""
    teacher, localiser = premises_of(spec)
    if preset.premise_n <= 0 or not (teacher or localiser):
        return 0.0
    return preset.premise_n * (1 + bool(localiser)) * eval_seconds / max(preset.eval_n, 1)


def estimate_wall_time(plan: list[tuple[str, int, str]], preset: Preset, start: str, jobs: int,
                       progress: bool = False, eval_seconds: float = 0.0,
                       recorded: dict[str, tuple[Timing, str]] | None = None) -> dict[str, Any]:
    """Estimates the wall time of the runs still to do (estimate): a method with finished or part-way runs in
    `plan` is costed from their own clocks (measured_timings), else from what an earlier start of the comparison
    recorded (`recorded`: recorded_steps), else by timing one step of it.
    eval_seconds: one curve evaluation as already timed (recorded_eval_seconds), else 0.0 to time it."""
    pending = [(spec, seed, preset.token_budget - tokens_done(run_dir, preset.token_budget))
               for spec, seed, run_dir in plan if not finished_run(run_dir)]
    measured = {**(recorded or {}), **measured_timings(plan)}
    first_seed: dict[str, int] = {}
    for spec, seed, _ in pending:
        if spec not in measured:
            first_seed.setdefault(spec, seed)
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    timings, eval_seconds = (time_methods(list(first_seed.items()), lambda m, s: run_config(m, s, preset, start),
                                          threads, progress, eval_seconds=eval_seconds)
                             if first_seed else ({}, eval_seconds))
    needs_eval = pending or preset.audit_n > 0 or preset.premise_n > 0
    if needs_eval and not eval_seconds:  # no step was timed and no evaluation recorded: time one
        eval_seconds = time_evaluation(run_config(preset.methods[0], preset.seeds[0], preset, start), threads)
    out = estimate([(spec, left) for spec, _, left in pending],
                   {**timings, **{spec: timing for spec, (timing, _) in measured.items()}}, eval_seconds,
                   eval_every_tokens=preset.eval_every_tokens, final_eval_ratio=preset.final_eval_n / preset.eval_n,
                   jobs=jobs, measured={spec: source for spec, (_, source) in measured.items()})
    after = after_training_seconds(preset, eval_seconds)
    return {**out, **after, "eval_n": preset.eval_n, "seconds": out["seconds"] + sum(after.values())}


STEPS_UNKNOWN = 4
"""Steps a trace is taken to have where the task's problems carry no worked solution to count them from."""


def after_training_seconds(preset: Preset, eval_seconds: float) -> dict[str, float]:
    """{audit_seconds, premise_seconds}: the start audit (preset.audit_n traces, k_ref Monte-Carlo continuations
    from each step boundary, each on average half a trace long) and the premise checks (preset.premise_n traces
    of the start and of each final policy of a method that rests on a premise, plus a reply to each localiser's
    request), costed in completions at the timed evaluation's seconds per completion. Rough, and long rather
    than short: a reference or a premise measurement kept from an earlier start is counted as if measured again."""
    per_completion = eval_seconds / max(preset.eval_n, 1)
    audit = preset.audit_n * (1 + preset.audit_k_ref * steps_per_trace(preset) / 2) if preset.audit_n > 0 else 0
    premise = 0.0
    if preset.premise_n > 0:
        needs = [premises_of(m) for m in preset.methods]
        policies = 1 + len(preset.seeds) * sum(bool(teacher or loc) for teacher, loc in needs)
        premise = preset.premise_n * policies * (1 + any(loc for _, loc in needs)) if policies > 1 else 0.0
    return {"audit_seconds": round(audit * per_completion, 1), "premise_seconds": round(premise * per_completion, 1)}


def steps_per_trace(preset: Preset) -> float:
    """The mean number of steps of the task's worked solutions (of 8 held-out problems), STEPS_UNKNOWN without."""
    task = make_task(preset.task, preset.train.get("task_options", {}))
    counts = []
    for problem in task.heldout_problems(8):
        lines = (task.solution_lines(problem) if hasattr(task, "solution_lines")
                 else getattr(task, "reference_solution", lambda p: None)(problem))
        if lines:
            counts.append(len(lines))
    return sum(counts) / len(counts) if counts else STEPS_UNKNOWN
