"""`credo compare --status`: where a comparison stands, read from its run directory without touching it.

A long comparison (`--preset long`: 60 runs, ~8 h or more on 2 cores) outlives a terminal and is resumed
across sessions; before its results.json exists the record is `runs/<method>-s<seed>/` and estimate.json.
This view reads those (summary.json of a finished run, the last metrics row of one part-way being trained or the
newest checkpoint of one stopped, failure-*.txt of a failed one; estimate.json's timed step for a method none of
whose runs has logged a step, and its timed evaluation) and prints the time left (training, evaluations, premise
checks) and, per method, the final accuracy of each finished seed and the paired difference to GRPO on the seeds
both finished. It writes nothing, so it is safe beside the running comparison. It judges no goal: a partial grid
is not the comparison's result (the report of the finished comparison is). It must be given the run's own
--preset/--methods/--seeds/--budget: a run made with another budget is refused in one line.
"""

from __future__ import annotations

import os
from typing import Any

from credo.lab.compare import eta as compare_eta
from credo.lab.compare.runs import clock_so_far, failure_path, finished, progress_of, run_result, tokens_done
from credo.lab.compare.premises import pending_path
from credo.lab.compare.presets import Preset, run_dir_name
from credo.lab.compare.goals import points
from credo.lab.compare.stats import paired, paired_deltas
from credo.core.config import ConfigError
from credo.core.outputs import lock_held
from credo.train.config import config_from_run


def run_state(run_dir: str, budget: int, failure_file: str) -> dict[str, Any]:
    """{state: finished | failed | part-way | not started, result? (finished), tokens?, step?, running?} of one run.
    A part-way run being trained (its trainer holds the run's lock) holds the tokens its log has reached; a stopped
    one those of its newest checkpoint, where a resume goes on from (tokens_done). Where the lock cannot be told
    (lock_held: None), the log's, and it is not called stopped. (A run read in the instant between its last step
    and its summary, or before a resumed worker's trainer takes the lock, can read as stopped.)"""
    if finished(run_dir):
        return {"state": "finished", "result": run_result(run_dir)}  # its clock without stalled steps
    tokens, step = progress_of(run_dir, budget)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(failure_file) and not (os.path.exists(metrics) and
                                             os.path.getmtime(metrics) > os.path.getmtime(failure_file)):
        return {"state": "failed"}  # (a failed run that a resumed comparison is retrying is part-way)
    if step == 0:
        return {"state": "not started"}
    running = lock_held(run_dir) is not False
    return {"state": "part-way", "tokens": tokens if running else tokens_done(run_dir, budget), "step": step,
            "clock": clock_so_far(metrics), "running": running}


def check_plan(preset: Preset, out_dir: str) -> None:
    """The runs on disk were made with the plan's budget (else every percentage would be wrong)."""
    for method in preset.methods:
        for seed in preset.seeds:
            run_dir = os.path.join(out_dir, "runs", run_dir_name(method, seed))
            if os.path.exists(os.path.join(run_dir, "config.yaml")):
                budget = config_from_run(run_dir).max_generated_tokens
                if budget != preset.token_budget:
                    raise ConfigError(f"{run_dir} was run with a budget of {budget:,} generated tokens, not "
                                      f"{preset.token_budget:,}: give --status the run's own --preset/--budget")


def plan_states(preset: Preset, out_dir: str) -> dict[str, dict[int, dict[str, Any]]]:
    """{method: {seed: run_state}} for every (method, seed) the preset plans."""
    return {method: {seed: run_state(os.path.join(out_dir, "runs", run_dir_name(method, seed)), preset.token_budget,
                                     failure_path(out_dir, method, seed)) for seed in preset.seeds}
            for method in preset.methods}


def remaining_seconds(states: dict[str, dict[int, dict[str, Any]]], budget: int, jobs: int,
                      timed: dict[str, tuple[compare_eta.Timing, str]] | None = None
                      ) -> tuple[float, float, list[str], list[str]]:
    """Seconds of *training* the unfinished runs still need at `jobs` at a time, and summed over the runs (the
    compute left, however many run at once; evaluations are not in a run's clock, so not here), each method
    costed from its finished runs, or else from the steps its part-way runs have logged
    (compare_eta.timing_from_runs; a part-way run counts its unfinished share of the budget, a failed one all of
    it, since a resume retries it), or else from `timed`, the step the comparison timed at its start
    (compare_eta.timed_steps); then the methods costed from `timed` ('name (where from)'), and those with no
    cost."""
    total, from_timed, unknown, pending, timed = 0.0, [], [], 0, timed or {}
    for method, runs in states.items():
        measured = compare_eta.timing_from_runs([st["result"] for st in runs.values() if st["state"] == "finished"],
                                                [st["clock"] for st in runs.values() if st.get("clock")])
        timing = measured[0] if measured else None
        left = [budget - st.get("tokens", 0) for st in runs.values() if st["state"] != "finished"]
        pending += len(left)
        if left and timing is None and method in timed:
            timing, source = timed[method]
            from_timed.append(f"{method} ({source})" if source else method)
        if left and timing is None:
            unknown.append(method)
        elif left:
            total += sum(compare_eta.run_seconds(timing, tokens, budget, 0.0, 0.0) for tokens in left)
    return total / max(1, min(jobs, pending)), total, from_timed, unknown


def evaluations_left(states: dict[str, dict[int, dict[str, Any]]], preset: Preset, out_dir: str,
                     eval_seconds: float) -> float:
    """Seconds of the evaluations and premise checks still to do, summed over the runs, at eval_seconds per
    curve evaluation of preset.eval_n problems (the one the comparison timed at its start): each unfinished run's
    curve evaluations left and its final one, the premise checks of each run that rests on one and has not had
    them (a finished run whose checks are pending included), and those of the start, made at the comparison's
    end (with its audit, until its results.json exists)."""
    total = 0.0
    for method, runs in states.items():
        checks = compare_eta.premise_check_seconds(preset, method, eval_seconds)
        for seed, state in runs.items():
            if state["state"] != "finished":
                total += checks + compare_eta.evaluation_seconds(
                    preset.token_budget - state.get("tokens", 0), preset.eval_every_tokens, eval_seconds,
                    preset.final_eval_n / max(preset.eval_n, 1))
            elif os.path.exists(pending_path(os.path.join(out_dir, "runs", run_dir_name(method, seed)))):
                total += checks
    if not os.path.exists(os.path.join(out_dir, "premises", "start.json")):
        total += max(compare_eta.premise_check_seconds(preset, m, eval_seconds) for m in preset.methods)
    if preset.audit_n > 0 and not os.path.exists(os.path.join(out_dir, "results.json")):
        total += compare_eta.after_training_seconds(preset, eval_seconds)["audit_seconds"]
    return total


def _cell(state: dict[str, Any], budget: int) -> str:
    if state["state"] == "finished":
        return f"{state['result']['final_accuracy']:.3f}"
    if state["state"] == "part-way":
        return f"({100 * state['tokens'] / budget:.0f}%{'' if state['running'] else ', stopped'})"
    return "failed" if state["state"] == "failed" else "·"


def _time_left(states: dict[str, dict[int, dict[str, Any]]], preset: Preset, out_dir: str, jobs: int) -> str:
    """The status line that says how long the unfinished runs still need: training, from the runs' own clocks
    (remaining_seconds), and their evaluations and premise checks at the evaluation the comparison timed at its
    start with as many jobs (evaluations_left; not counted where it timed none)."""
    seconds, summed, from_timed, unknown = remaining_seconds(states, preset.token_budget, jobs,
                                                             compare_eta.timed_steps(out_dir))
    eval_seconds = compare_eta.recorded_eval_seconds(out_dir, preset.eval_n, jobs)
    if eval_seconds:
        evaluations = evaluations_left(states, preset, out_dir, eval_seconds)
        unfinished = sum(st["state"] != "finished" for runs in states.values() for st in runs.values())
        at_once = seconds + evaluations / max(1, min(jobs, unfinished))
        text = (f"about {compare_eta.describe(at_once)} left at {jobs} at a time "
                f"({compare_eta.describe(summed + evaluations)} summed over the runs: "
                f"{compare_eta.describe(summed)} of training, from the finished runs' own clocks, or the part-way "
                f"ones'; {compare_eta.describe(evaluations)} of evaluations and premise checks, at "
                f"{eval_seconds:.0f} s an evaluation of {preset.eval_n} problems as timed at the comparison's start)")
    else:
        text = (f"about {compare_eta.describe(seconds)} of training left at {jobs} at a time "
                f"({compare_eta.describe(summed)} summed over the runs), from the finished "
                "runs' own clocks, or the part-way ones' (evaluations not counted: the comparison timed none "
                f"of {preset.eval_n} problems with {jobs} at a time)")
    return (text + (f"; from the estimate made at the comparison's start: {', '.join(from_timed)}"
                    if from_timed else "")
            + (f"; not counting {', '.join(unknown)}: no step logged yet" if unknown else ""))


def status_text(preset: Preset, out_dir: str, jobs: int | None = None) -> str:
    """The status table as plain text (a header, one row per method); jobs (default: the preset's) for the
    time left. Raises ConfigError when the runs on disk were made with another budget."""
    check_plan(preset, out_dir)
    states = plan_states(preset, out_dir)
    jobs = jobs or preset.jobs
    counts = {k: 0 for k in ("finished", "part-way", "failed", "not started")}
    for runs in states.values():
        for state in runs.values():
            counts[state["state"]] += 1
    finals = {m: {str(s): st["result"] for s, st in runs.items() if st["state"] == "finished"}
              for m, runs in states.items()}
    lines = [f"{out_dir}: {counts['finished']} of {sum(counts.values())} runs finished, {counts['part-way']} part-way, "
             f"{counts['failed']} failed, {counts['not started']} not started "
             f"({preset.token_budget:,} generated tokens a run; (n%) = part-way, being trained; (n%, stopped) = "
             "part-way, no process training it: n% is its newest checkpoint's, where a resume goes on)"]
    if counts["finished"] < sum(counts.values()):
        lines.append(_time_left(states, preset, out_dir, jobs))
    planned = {run_dir_name(m, s) for m in preset.methods for s in preset.seeds}
    others = sorted(set(os.listdir(os.path.join(out_dir, "runs"))) - planned)
    if others:
        lines.append(f"also in runs/, not in this plan (give the run's --methods/--seeds): {', '.join(others)}")
    width = max(len(m) for m in states) + 2
    seeds_header = " ".join(f"{'s' + str(s):>7}" for s in preset.seeds)
    lines += ["partial: no goal is judged before every run has finished (then: the comparison's report.md)", "",
              f"{'method':<{width}}{seeds_header}   {'mean':>6}   vs grpo, paired on seeds both "
              "finished (points, 95% t)"]
    for method, runs in states.items():
        done = [r["final_accuracy"] for r in finals[method].values()]
        mean = f"{sum(done) / len(done):.3f}" if done else "—"
        one_problem = 1 / preset.final_eval_n if preset.final_eval_n else 0.0
        delta = "" if method == "grpo" else points(paired(paired_deltas(
            finals[method], finals["grpo"], lambda run: run["final_accuracy"]), resolution=one_problem))
        cells = " ".join(f"{_cell(runs[s], preset.token_budget):>7}" for s in preset.seeds)
        lines.append(f"{method:<{width}}{cells}   {mean:>6}   {delta}")
    return "\n".join(lines)
