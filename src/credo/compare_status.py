"""`credo compare --status`: where a comparison stands, read from its run directory without touching it.

A long comparison (`--preset long`: 60 runs, ~8 h on 2 cores) outlives a terminal and is resumed across
sessions; before its results.json exists the only record is `runs/<method>-s<seed>/`. This view reads
those (summary.json of a finished run, the last metrics row of one part-way, failure-*.txt of a failed one)
and prints, per method, the final accuracy of each finished seed and the paired difference to GRPO on the
seeds both finished. It writes nothing, so it is safe beside the running comparison. It judges no goal:
a partial grid is not the comparison's result (the report of the finished comparison is).
"""

from __future__ import annotations

import os
from typing import Any

from credo.compare import progress_of, run_result
from credo.compare_presets import Preset, run_dir_name
from credo.compare_report import points
from credo.compare_stats import paired, paired_deltas


def run_state(run_dir: str, budget: int, failure_file: str) -> dict[str, Any]:
    """{state: finished | failed | part-way | not started, final_accuracy?, tokens?} of one planned run."""
    if os.path.exists(os.path.join(run_dir, "summary.json")):
        done = run_result(run_dir)  # its clock without stalled steps (a paused comparison)
        return {"state": "finished", "final_accuracy": done["final_accuracy"], "seconds": done["seconds"]}
    if os.path.exists(failure_file):
        return {"state": "failed"}
    tokens, step = progress_of(run_dir, budget)
    if step > 0:
        return {"state": "part-way", "tokens": tokens, "step": step}
    return {"state": "not started"}


def plan_states(preset: Preset, out_dir: str) -> dict[str, dict[int, dict[str, Any]]]:
    """{method: {seed: run_state}} for every (method, seed) the preset plans."""
    states: dict[str, dict[int, dict[str, Any]]] = {}
    for method in preset.methods:
        states[method] = {}
        for seed in preset.seeds:
            name = run_dir_name(method, seed)
            states[method][seed] = run_state(os.path.join(out_dir, "runs", name), preset.token_budget,
                                             os.path.join(out_dir, f"failure-{name}.txt"))
    return states


def remaining_seconds(states: dict[str, dict[int, dict[str, Any]]], budget: int, jobs: int) -> tuple[float, list[str]]:
    """Wall seconds the unfinished runs still need at `jobs` at a time, from each method's finished runs' own
    clocks (a part-way run counts its unfinished share of the budget), and the methods with no finished run
    yet, whose runs it cannot count."""
    total, unknown = 0.0, []
    for method, runs in states.items():
        clocks = [st["seconds"] for st in runs.values() if st["state"] == "finished"]
        left = [1 - st.get("tokens", 0) / budget for st in runs.values() if st["state"] in ("part-way", "not started")]
        if left and not clocks:
            unknown.append(method)
        elif left:
            total += sum(left) * sum(clocks) / len(clocks)
    return total / max(jobs, 1), unknown


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _cell(state: dict[str, Any], budget: int) -> str:
    if state["state"] == "finished":
        return f"{state['final_accuracy']:.3f}"
    if state["state"] == "part-way":
        return f"({100 * state['tokens'] / budget:.0f}%)"
    return "failed" if state["state"] == "failed" else "·"


def status_text(preset: Preset, out_dir: str, jobs: int | None = None) -> str:
    """The status table as plain text (a header, one row per method); jobs (default: the preset's) for the
    time left."""
    states = plan_states(preset, out_dir)
    counts = {k: 0 for k in ("finished", "part-way", "failed", "not started")}
    for runs in states.values():
        for state in runs.values():
            counts[state["state"]] += 1
    total = sum(counts.values())
    finals = {m: {str(s): {"final_accuracy": st["final_accuracy"]} for s, st in runs.items() if st["state"] == "finished"}
              for m, runs in states.items()}
    head = (f"{out_dir}: {counts['finished']} of {total} runs finished, {counts['part-way']} part-way, "
            f"{counts['failed']} failed, {counts['not started']} not started "
            f"({preset.token_budget:,} generated tokens a run; (n%) = part-way)")
    seconds, unknown = remaining_seconds(states, preset.token_budget, jobs or preset.jobs)
    if counts["part-way"] + counts["not started"]:
        head += (f"\nabout {_duration(seconds)} left at {jobs or preset.jobs} at a time, from the finished runs' own clocks"
                 + (f" (not counting {', '.join(unknown)}: no finished run yet)" if unknown else ""))
    width = max(len(m) for m in states) + 2
    seeds_header = " ".join(f"{'s' + str(s):>7}" for s in preset.seeds)
    lines = [head, "partial: no goal is judged before every run has finished (then: the comparison's report.md)", "",
             f"{'method':<{width}}{seeds_header}   {'mean':>6}   vs grpo, paired on seeds both finished (points, 95% t)"]
    for method, runs in states.items():
        done = [st["final_accuracy"] for st in runs.values() if st["state"] == "finished"]
        mean = f"{sum(done) / len(done):.3f}" if done else "—"
        delta = "" if method == "grpo" else points(paired(paired_deltas(
            finals[method], finals["grpo"], lambda run: run["final_accuracy"])))
        cells = " ".join(f"{_cell(runs[s], preset.token_budget):>7}" for s in preset.seeds)
        lines.append(f"{method:<{width}}{cells}   {mean:>6}   {delta}")
    return "\n".join(lines)
