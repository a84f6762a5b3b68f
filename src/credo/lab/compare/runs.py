"""A comparison's run directories read back: each finished run as results.json records it, how far a run in
another process has got, and where a failed run's traceback is kept. Reads only; the runs are written by
credo.train.trainer.Trainer (credo.lab.compare.run trains them)."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any, Iterator

import yaml

from credo.lab.compare.presets import run_dir_name
from credo.lab.compare.stats import clipping, stalled_seconds
from credo.core.files import MetricsLog, last_checkpoint, read_jsonl
from credo.core.records import METRICS_FIELDS, SUMMARY_FIELDS, checked_record, read_record
from credo.train.config import TrainConfig
from credo.train.shaping import OVERLONG_FIT_PROBLEMS


def finished(run_dir: str) -> bool:
    """Whether a run finished (its summary.json, the last file its trainer writes, exists)."""
    return os.path.exists(os.path.join(run_dir, "summary.json"))


def failure_path(out_dir: str, method: str, seed: int) -> str:
    """Where a comparison keeps the traceback of a (method, seed) run that failed."""
    return os.path.join(out_dir, f"failure-{run_dir_name(method, seed)}.txt")


def clear_failure(out_dir: str, method: str, seed: int) -> None:
    """Removes the traceback file of a run that failed in an earlier invocation and has finished since (compare's
    own file), which would otherwise report a failure that is gone."""
    path = failure_path(out_dir, method, seed)
    if os.path.isfile(path):
        os.remove(path)


def run_result(run_dir: str) -> dict[str, Any]:
    """One finished training run as results.json records it, read from its run directory. Its `seconds`
    and `seconds_per_step` leave out stalled steps (compare_stats.stalled_seconds); its curve keeps the
    training clock as logged."""
    summary = read_record(os.path.join(run_dir, "summary.json"), SUMMARY_FIELDS,
                          required=("step", "tokens_generated", "seconds", "final_accuracy"))
    config = recorded_config(run_dir)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    rows = MetricsLog(metrics).rows()
    for row in rows:  # a curve point needs its position (every credo wrote them)
        if "eval_accuracy" in row:
            checked_record(row, f"{metrics} (an eval_accuracy row)", {}, required=("step", "tokens_generated",
                                                                                   "seconds"))
    curve = [{"step": r["step"], "tokens_generated": r["tokens_generated"], "seconds": r["seconds"],
              "accuracy": r["eval_accuracy"]} for r in rows if "eval_accuracy" in r]
    steps = [r for r in rows if r.get("step", 0) > 0]
    curve.append({"step": summary["step"], "tokens_generated": summary["tokens_generated"],
                  "seconds": summary["seconds"], "accuracy": summary["final_accuracy"], "final": True})
    # a paused process's clock is not the method's cost: its stalled steps count at the run's median step
    stalled, stalled_steps = stalled_seconds([float(r["seconds"]) for r in steps if "seconds" in r])
    norms = [float(r["grad_norm"]) for r in steps if "grad_norm" in r]
    updates = [float(r["update_norm"]) for r in steps if "update_norm" in r]  # runs from before it: none
    return {"curve": curve, "final_accuracy": summary["final_accuracy"], "steps": summary["step"],
            "tokens_generated": summary["tokens_generated"], "seconds": summary["seconds"] - stalled,
            "stalled_seconds": stalled, "stalled_steps": stalled_steps,
            "seconds_per_step": (summary["seconds"] - stalled) / max(summary["step"], 1),
            "tokens_scored": steps[-1].get("tokens_scored", 0) if steps else 0,
            **(clipping(norms, run_grad_clip(config)) if norms else {}), **run_overlong(config, summary),
            **({"update_norm_median": statistics.median(updates)} if updates else {}),
            **({"commit": summary["credo_commit"]} if "credo_commit" in summary else {}),
            **({"machine": summary["machine"]} if isinstance(summary.get("machine"), str) else {})}


def recorded_config(run_dir: str) -> dict[str, Any]:
    """The settings a run recorded in its config.yaml, read once for everything run_result takes from them ({} for
    a record without one, or one that is not a mapping)."""
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        config = yaml.safe_load(f)
    return config if isinstance(config, dict) else {}


def run_overlong(config: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """{'overlong': {'buffer', 'max_new_tokens', 'longest_worked_solution', 'fit_problems'}} when the run applied
    DAPO's overlong penalty (the buffer it used, fitted to the task or as set in its config), else {}."""
    # (a run recorded before sampling settings were grouped keeps max_new_tokens at the top level)
    max_new_tokens = (config.get("sampling") or {}).get("max_new_tokens", config.get("max_new_tokens"))
    if not config.get("overlong_penalty", 1.0) > 0:  # a factor of 0 shapes nothing, whatever the buffer
        return {}
    if "overlong_buffer_used" in summary:  # fitted to the task (train/shaping.py)
        return {"overlong": {"buffer": summary["overlong_buffer_used"], "max_new_tokens": max_new_tokens,
                             "longest_worked_solution": summary.get("longest_worked_solution"),
                             "fit_problems": OVERLONG_FIT_PROBLEMS}}
    if config.get("overlong_buffer", 0) > 0:
        return {"overlong": {"buffer": config["overlong_buffer"], "max_new_tokens": max_new_tokens,
                             "longest_worked_solution": None}}
    return {}


def run_grad_clip(config: dict[str, Any]) -> float:
    """The gradient-norm clip a run trained with, from its recorded config (TrainConfig's default where absent)."""
    return float(config.get("grad_clip", TrainConfig.grad_clip))


def clock_so_far(metrics_path: str) -> dict[str, Any] | None:
    """{steps, seconds, tokens_generated} a part-way run has logged (stalled steps left out), shaped like a
    run_result for compare_eta.measured_timing; None before its first step or without a log."""
    if not os.path.exists(metrics_path):
        return None
    rows = [r for r in read_jsonl(metrics_path, True, METRICS_FIELDS) if r.get("step", 0) > 0 and "seconds" in r]
    if not rows:
        return None
    clock = [float(r["seconds"]) for r in rows]
    return {"steps": int(rows[-1]["step"]), "seconds": clock[-1] - stalled_seconds(clock)[0],
            "tokens_generated": int(rows[-1].get("tokens_generated", 0))}


def progress_of(run_dir: str, budget: int) -> tuple[int, int]:
    """(generated tokens, step) of a run in another process, read from its metrics log."""
    for row in _rows_newest_first(run_dir):
        return min(int(row.get("tokens_generated", 0)), budget), int(row.get("step", 0))
    return 0, 0


def tokens_done(run_dir: str, budget: int) -> int:
    """Generated tokens a run already holds: the whole budget when it finished; when part-way, those of its newest
    checkpoint, which is where a resume goes on from (the steps its log holds beyond it are trained again); 0
    without one. What a resumed comparison's progress bar starts at and its estimate leaves out."""
    if finished(run_dir):
        return budget
    checkpoint = last_checkpoint(run_dir)
    if checkpoint is None:
        return 0
    step = int(os.path.basename(checkpoint)[len("step-"):])
    for row in _rows_newest_first(run_dir):
        if row.get("step") == step:
            return min(int(row.get("tokens_generated", 0)), budget)
    return 0


def _rows_newest_first(run_dir: str) -> Iterator[dict[str, Any]]:
    """The rows of a run's metrics log, last first, skipping a line being written (or a damaged one: the run's own
    reads name it); none without a log."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    for line in reversed(lines):
        try:
            yield checked_record(json.loads(line), path, METRICS_FIELDS)
        except ValueError:
            continue
