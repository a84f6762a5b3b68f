"""`credo compare`: every method trained from the same start, side by side, in one run directory.

Each (method, seed) run starts from the same cached SFT checkpoint, sees the same prompts per step
and group size, and stops at the same budget of *generated* tokens (resets and MC continuations
count). Held-out accuracy is measured whenever the generated-token count crosses a multiple of the
eval interval, so every curve shares one x axis. The run directory holds
  runs/<method>-s<seed>/   each training run (config, metrics.jsonl, checkpoints, final/)
  audit/                   the credit audit of the start checkpoint for the estimators compared
  results.json             curves, finals, tokens-to-GRPO-final, step times, audit rows, failures
  report.md, curves.png (accuracy vs generated tokens), curves_by_update.png, audit.png
A method that fails is reported in the table and the comparison goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm

from credo import methods as method_registry
from credo.audit import AuditConfig, run_audit
from credo.compare_report import goals, plot_curves, report, summarise  # noqa: F401  (re-exported)
from credo.runs import MetricsLog, atomic_write_json, atomic_write_text
from credo.train import Trainer, load_train_config

ALL_METHODS = ("grpo", "dr_grpo", "rloo", "dapo", "gspo", "vineppo", "spo_chain", "rredcot", "ibpo", "sc_grpo", "rrpo", "srpo")


@dataclass(frozen=True)
class Preset:
    """methods/seeds: what to run. token_budget: generated tokens per run. eval_every_tokens, eval_n:
    the shared accuracy curve; final_eval_n: the final held-out evaluation. train: TrainConfig
    overrides for every run. audit_*: the credit audit of the start (audit_n = 0 skips it)."""

    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    token_budget: int
    eval_every_tokens: int
    eval_n: int
    final_eval_n: int
    train: dict[str, Any] = field(default_factory=dict)
    audit_n: int = 64
    audit_k_ref: int = 16


PRESETS = {
    # ~15 minutes on 2 cores: the baseline, the cheapest credit method, a reset method, and self-conditioning
    "quick": Preset(methods=("grpo", "rredcot", "srpo", "sc_grpo"), seeds=(0,), token_budget=230_000,
                    eval_every_tokens=57_500, eval_n=200, final_eval_n=500, audit_n=64, audit_k_ref=16),
    # every method, 3 seeds, the quick budget (~114 GRPO steps): 58 minutes on 2 cores with --jobs 2
    "full": Preset(methods=ALL_METHODS, seeds=(0, 1, 2), token_budget=260_000, eval_every_tokens=65_000,
                   eval_n=300, final_eval_n=500, audit_n=128, audit_k_ref=16),
    # for tests: a minute on a tiny model
    "smoke": Preset(methods=("grpo", "rredcot"), seeds=(0,), token_budget=1_500, eval_every_tokens=600, eval_n=8,
                    final_eval_n=8, train={"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 24},
                    audit_n=8, audit_k_ref=2),
}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_config(method: str, seed: int, preset: Preset, start: str) -> Any:
    overrides = {**preset.train, "method": method, "seed": seed, "start": start, "steps": 1_000_000,
                 "max_generated_tokens": preset.token_budget, "eval_every_tokens": preset.eval_every_tokens,
                 "eval_n": preset.eval_n, "final_eval_n": preset.final_eval_n, "checkpoint_every": 50}
    return load_train_config(None, None, overrides)


def check_reusable(plan: list[tuple[str, int, str]], preset: Preset, start: str) -> None:
    """A run directory left by an earlier comparison is reused (or resumed) only if it was made with
    the same training config; otherwise mixing budgets or starts would corrupt the table."""
    import yaml
    from credo.config import ConfigError, dump_yaml
    for method, seed, run_dir in plan:
        path = os.path.join(run_dir, "config.yaml")
        if not os.path.exists(path):
            continue
        old = _flatten(yaml.safe_load(open(path)))
        new = _flatten(yaml.safe_load(dump_yaml(run_config(method, seed, preset, start))))
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if changed:
            raise ConfigError(f"{run_dir} was made with a different config ({', '.join(f'{k}: {old.get(k)!r} -> {new.get(k)!r}' for k in changed[:4])}); "
                             "choose a new --out or remove that run directory")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def run_one(method: str, seed: int, preset: Preset, start: str, run_dir: str, on_step: Any) -> dict[str, Any]:
    if not os.path.exists(os.path.join(run_dir, "summary.json")):  # else finished earlier: reuse (resumable)
        Trainer(run_config(method, seed, preset, start), run_dir, progress=False, on_step=on_step).train()
    return run_result(run_dir)


def run_result(run_dir: str) -> dict[str, Any]:
    """One finished training run as results.json records it, read from its run directory."""
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    rows = MetricsLog(os.path.join(run_dir, "metrics.jsonl")).rows()
    curve = [{"step": r["step"], "tokens_generated": r["tokens_generated"], "seconds": r["seconds"],
              "accuracy": r["eval_accuracy"]} for r in rows if "eval_accuracy" in r]
    steps = [r for r in rows if r.get("step", 0) > 0]
    curve.append({"step": summary["step"], "tokens_generated": summary["tokens_generated"],
                  "seconds": summary["seconds"], "accuracy": summary["final_accuracy"], "final": True})
    return {"curve": curve, "final_accuracy": summary["final_accuracy"], "steps": summary["step"],
            "tokens_generated": summary["tokens_generated"], "seconds": summary["seconds"],
            "seconds_per_step": summary["seconds"] / max(summary["step"], 1),
            "tokens_scored": steps[-1].get("tokens_scored", 0) if steps else 0}


def _run_serial(plan: list[tuple[str, int, str]], preset: Preset, start: str, bar: tqdm) -> list[tuple[Any, str | None]]:
    outcomes = []
    for method, seed, run_dir in plan:
        state = {"tokens": 0}

        def on_step(trainer: Trainer, row: dict, method: str = method, seed: int = seed, state: dict = state) -> None:
            bar.update(min(row["tokens_generated"], preset.token_budget) - state["tokens"])
            state["tokens"] = min(row["tokens_generated"], preset.token_budget)
            bar.set_description(f"{method} seed {seed} step {row['step']}")

        try:
            outcomes.append((run_one(method, seed, preset, start, run_dir, on_step), None))
        except Exception:
            outcomes.append((None, traceback.format_exc()))
        bar.update(preset.token_budget - state["tokens"])
    return outcomes


def _worker(method: str, seed: int, preset: Preset, start: str, run_dir: str, threads: int) -> tuple[Any, str | None]:
    import torch
    torch.set_num_threads(threads)
    try:
        return run_one(method, seed, preset, start, run_dir, None), None
    except Exception:
        return None, traceback.format_exc()


def _progress_of(run_dir: str, budget: int) -> tuple[int, int]:
    """(generated tokens, step) of a run in another process, read from its metrics log."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0, 0
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    for line in reversed(lines):
        try:
            row = json.loads(line)
            return min(int(row.get("tokens_generated", 0)), budget), int(row.get("step", 0))
        except (ValueError, json.JSONDecodeError):
            continue  # a line being written
    return 0, 0


def _run_parallel(plan: list[tuple[str, int, str]], preset: Preset, start: str, bar: tqdm, jobs: int) -> list[tuple[Any, str | None]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    threads = max(1, (os.cpu_count() or 1) // jobs)
    context = multiprocessing.get_context("spawn")  # no forked torch thread pools
    outcomes: dict[int, tuple[Any, str | None]] = {}
    shown = 0
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(_worker, m, s, preset, start, d, threads): i for i, (m, s, d) in enumerate(plan)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
            for future in done:
                try:
                    outcomes[futures[future]] = future.result()
                except Exception:  # the worker itself died (killed, out of memory)
                    outcomes[futures[future]] = (None, traceback.format_exc())
            started = sorted((futures[f], *_progress_of(plan[futures[f]][2], preset.token_budget)) for f in pending)
            started = [row for row in started if row[1] > 0]  # queued runs have no log yet
            now = preset.token_budget * len(outcomes) + sum(tokens for _, tokens, _ in started)
            bar.update(now - shown)
            shown = now
            running = ", ".join(f"{plan[i][0]} seed {plan[i][1]} step {step}" for i, _, step in started[:jobs])
            bar.set_description(f"{len(outcomes)}/{len(plan)} runs done" + (f"; running {running}" if running else ""))
    return [outcomes[i] for i in range(len(plan))]


def compare(preset_name: str, out_dir: str, methods: tuple[str, ...] | None = None, seeds: tuple[int, ...] | None = None,
            start: str | None = None, progress: bool = True, jobs: int = 1,
            token_budget: int | None = None, command: str | None = None) -> dict[str, Any]:
    """Runs the preset and writes the run directory; returns results.json's content.

    jobs > 1 runs that many (method, seed) trainings at once in worker processes, each with
    cpu_count // jobs threads (on 2 cores two one-thread jobs finished a small grid 1.15x sooner than one
    two-thread job, `bench/compare_jobs.py`: small matmuls scale poorly to two threads). Every run of one comparison should
    use the same `jobs`, since step times are compared across methods. token_budget replaces the
    preset's budget of generated tokens per run (evaluated at each quarter of it)."""
    if preset_name not in PRESETS:
        raise KeyError(f"unknown preset {preset_name!r}; available: {', '.join(PRESETS)}")
    preset = PRESETS[preset_name]
    preset = replace(preset, methods=tuple(methods or preset.methods), seeds=tuple(seeds if seeds is not None else preset.seeds))
    if token_budget is not None:
        if token_budget <= 0:
            raise ValueError(f"token_budget must be a positive number of generated tokens, got {token_budget}")
        preset = replace(preset, token_budget=token_budget, eval_every_tokens=max(1, token_budget // 4))
    for m in preset.methods:
        method_registry.resolve(m)  # unknown names fail before any training
    if "grpo" not in preset.methods:
        preset = replace(preset, methods=("grpo",) + preset.methods)  # the yardstick is always run
    if not start:
        from credo.sft import ensure_sft
        start = ensure_sft(progress=progress)
    os.makedirs(out_dir, exist_ok=True)
    began = time.time()
    results: dict[str, Any] = {"preset": preset_name, "command": command, "start": start, "commit": _git_commit(),
                               "date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cpus",
                               "token_budget": preset.token_budget, "final_eval_n": preset.final_eval_n,
                               "methods": {}, "failures": {}}
    total = len(preset.methods) * len(preset.seeds) * preset.token_budget
    bar = tqdm(total=total, unit="tok", unit_scale=True, disable=not progress, dynamic_ncols=True)
    # seed-major: an interrupted comparison has every method at its first seeds
    plan = [(m, s, os.path.join(out_dir, "runs", f"{m}-s{s}")) for s in preset.seeds for m in preset.methods]
    check_reusable(plan, preset, start)
    outcomes = (_run_serial(plan, preset, start, bar) if jobs <= 1
                else _run_parallel(plan, preset, start, bar, jobs))
    for method in preset.methods:
        results["methods"][method] = {"seeds": {}}
    for (method, seed, _), (result, error) in zip(plan, outcomes):
        if error is None:
            results["methods"][method]["seeds"][str(seed)] = result
        else:  # reported, never hidden
            results["failures"][f"{method}-s{seed}"] = error.strip().splitlines()[-1]
            atomic_write_text(os.path.join(out_dir, f"failure-{method}-s{seed}.txt"), error)
    atomic_write_json(os.path.join(out_dir, "results.json"), results)
    bar.close()
    if preset.audit_n > 0:
        results["audit"] = audit_rows(preset, start, out_dir, progress)
    results["wall_seconds"] = time.time() - began
    write_report(results, out_dir)
    return results


def write_report(results: dict[str, Any], out_dir: str) -> None:
    """(Re)derives the summary and goal checks, then writes results.json, report.md and curves.png."""
    summarise(results)
    results["goals"] = goals(results)
    atomic_write_json(os.path.join(out_dir, "results.json"), results)
    atomic_write_text(os.path.join(out_dir, "report.md"), report(results))
    plot_curves(results, os.path.join(out_dir, "curves.png"))
    plot_curves(results, os.path.join(out_dir, "curves_by_update.png"), x="step")


def rewrite_report(out_dir: str) -> dict[str, Any]:
    """Rebuilds a finished comparison's report from its results.json and, where they are still on disk,
    its run directories (after a change to the report)."""
    path = os.path.join(out_dir, "results.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no results.json; run `credo compare --out {out_dir}` first")
    results = json.load(open(path))
    for method, entry in results["methods"].items():  # runs still on disk are re-read (newer fields)
        for seed in entry["seeds"]:
            run_dir = os.path.join(out_dir, "runs", f"{method}-s{seed}")
            if os.path.exists(os.path.join(run_dir, "summary.json")):
                entry["seeds"][seed] = run_result(run_dir)
    write_report(results, out_dir)
    return results


def audit_rows(preset: Preset, start: str, out_dir: str, progress: bool) -> dict[str, Any]:
    """Credit audit of the start checkpoint for the compared methods that are estimators."""
    from credo import credit
    estimators = []
    for m in preset.methods:
        name = method_registry.resolve(m).estimator
        if name in credit.names() and name not in estimators and name not in ("grpo",):
            estimators.append(name)
    config = AuditConfig(checkpoint=start, n=preset.audit_n, group_size=8 if preset.audit_n >= 16 else 4,
                         k_ref=preset.audit_k_ref, methods=tuple(estimators))
    try:
        report_ = run_audit(config, os.path.join(out_dir, "audit"), progress=progress)
        shutil.copy(os.path.join(out_dir, "audit", "audit.png"), os.path.join(out_dir, "audit.png"))
        return report_
    except Exception as err:
        return {"failure": f"{type(err).__name__}: {err}"}
