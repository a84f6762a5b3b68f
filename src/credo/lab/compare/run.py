"""`credo compare`: every method trained from the same start, side by side, in one run directory.

The protocol is a property of the command, not of the caller's care:
  - every (method, seed) run starts from the same start of the preset's task, sees the same prompts per
    step and group size, and stops at the same budget of *generated* tokens (resets and MC continuations
    count);
  - every method trains with one optimiser schedule (epochs x mini-batches per batch) and one learning
    rate; a recipe that sets its own (a paper's setting) keeps it, and the report lists it;
  - held-out accuracy is measured on one fixed set (the first eval_n held-out problems) whenever the
    generated-token count crosses a multiple of the eval interval, so every curve shares one x axis; the
    final evaluation uses the first final_eval_n (>= 1000 in the real presets);
  - differences to GRPO and to each `shuffled:of=<m>` control are paired by seed, with a 95% t interval
    and the seeds needed to resolve them; goals count only where the interval excludes 0;
  - the estimated wall time is printed before anything trains (credo.lab.compare.eta).
The run directory holds
  runs/<method>-s<seed>/   each training run (config, metrics.jsonl, checkpoints, final/)
  audit/                   the credit audit of the start checkpoint for the estimators compared
  results.json             protocol, curves, finals, intervals, equal-update table, controls, estimate
  estimate.json            the estimate made at the (latest) start, written once confirmed: --status costs
                           a method no run has logged a step of from it
  report.md, curves.png (accuracy vs generated tokens), curves_by_update.png, audit.png
A method that fails is reported in the table and the comparison goes on; a full disk (or a read-only one)
stops it, since no later run could write (credo.core.disk_errors): free space and rerun, finished runs are reused.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import replace
from typing import Any, Callable

import torch

from credo import credit
from credo.core.config import ConfigError, UserError
from credo.core.files import atomic_write_json, atomic_write_text
from credo.core.outputs import is_locked, run_lock
from credo.core.records import check_run_result
from credo.credit.registry import parse_spec
from credo.integrations.trackers import TrackingPlace
from credo.integrations.tracking import check_trackers, checked_names
from credo.lab.audit.config import AuditConfig
from credo.lab.audit.run import run_audit
from credo.lab.compare import eta as compare_eta
from credo.lab.compare.eta import estimate_wall_time
from credo.lab.compare.export import check_dest, exporter
from credo.lab.compare.goals import goals
from credo.lab.compare.grid import time_of_day, train_all
from credo.lab.compare.plots import plot_curves
from credo.lab.compare.premises import premises_at_end
from credo.lab.compare.presets import Preset, check_reusable, protocol, resolve_preset, run_dir_name
from credo.lab.compare.report import report, summarise
from credo.lab.compare.runs import clear_failure, failure_path, finished, run_result
from credo.lab.show.view import write_audit_page
from credo.policy import is_tiny_start
from credo.policy.device import device_name, resolve_device, resolve_dtype
from credo.train import methods as method_registry
from credo.train.interrupts import Interrupted
from credo.train.provenance import loaded_commit
from credo.train.sft import ensure_sft
from credo.train.starts import NAMED_START


def stopped_at(stop: Interrupted, preset: Preset, out_dir: str, command: str) -> Interrupted:
    """`stop` with its one line: how many of the comparison's runs finished, and the command that finishes it
    (finished runs are reused, the others resume from their last checkpoints)."""
    runs = [os.path.join(out_dir, "runs", run_dir_name(m, s)) for s in preset.seeds for m in preset.methods]
    done = sum(finished(run) for run in runs)
    return stop.explained(f"stopped by {stop.name}: {done} of {len(runs)} runs finished, the others keep their last "
                          f"checkpoints and no process is left running; rerun `{without_until(command)}` to finish "
                          "the comparison")


def without_until(command: str) -> str:
    """`command` without its --until HH:MM: a deadline is one session's, not the next one's."""
    words, kept = shlex.split(command), []
    for word in words:
        if kept and kept[-1] == "--until":
            kept.pop()
        elif not word.startswith("--until="):
            kept.append(word)
    return shlex.join(kept)


def default_start(task: str, progress: bool) -> str:
    """Where the task's default start is: the cached (or shipped) SFT start of `arith`, built here once if
    missing rather than by every worker at once; for another task '' (each run and the audit take that task's
    own default start). Runs record '' either way (compare(): a portable config.yaml)."""
    if task != "arith":
        return ""
    return ensure_sft(progress=progress)


def check_lora_start(preset: Preset, start: str) -> None:
    """LoRA for every run (compare.lora) needs a Hugging Face start: refused in one line before any timing, as
    each run would fail loading it. The task's default start and a named `sft:` start are tiny policies."""
    rank = preset.train.get("lora", {}).get("r", 0)
    if not rank:
        return
    tiny = not start or start.startswith(NAMED_START) or is_tiny_start(start)
    if tiny:
        raise ConfigError(f"compare.lora.r={rank}: LoRA needs a Hugging Face start; "
                          f"{start or f'the default start of {preset.task}'} is a tiny policy, which trains in full "
                          "(give --start a Hugging Face model or adapter, or set lora.r=0)")


def check_start(preset: Preset, preset_name: str, start: str) -> None:
    """A start the preset needs is given, and it can take the preset's LoRA adapters; else one line."""
    if preset.needs_start and not start:
        raise ConfigError(f"--preset {preset_name} needs --start: {preset.needs_start}")
    check_lora_start(preset, start)


def _exporter(out_dir: str, dest: str) -> Callable[[], None] | None:
    """compare.export_each's exporter of out_dir into dest, checked now (before any timing); None without one."""
    if not dest:
        return None
    check_dest(out_dir, dest, "--export-each")
    return exporter(out_dir, dest)


def compare(preset_name: str, out_dir: str, methods: tuple[str, ...] | None = None,
            seeds: tuple[int, ...] | None = None, start: str | None = None, progress: bool = True,
            jobs: int | None = None, token_budget: int | None = None, command: str | None = None,
            schedule: dict[str, Any] | None = None, confirm: Callable[[float], None] | None = None,
            task: str | None = None, report_to: tuple[str, ...] = (), device: str = "auto", dtype: str = "float32",
            share_gpu: bool = False, eval_split: str = "heldout", audit_n: int | None = None,
            premise_n: int | None = None, lora: dict[str, Any] | None = None, until: str = "",
            export_each: str = "") -> dict[str, Any]:
    """Runs the preset and writes the run directory; returns results.json's content.

    jobs (default: the preset's) > 1 runs that many (method, seed) trainings at once in worker processes, each with
    cpu_count // jobs threads (on 2 cores 2 one-thread jobs beat 1 two-thread job by 1.15x: bench/compare_jobs.py);
    every run of one comparison should use the same `jobs`, as step times are compared. token_budget replaces the
    preset's budget of generated tokens per run (evaluated at each quarter of it); schedule replaces the shared
    epochs/minibatches/lr; task the preset's task (the default start follows it). confirm(estimated seconds), called
    before any training, raises to stop (the CLI's --yes gate). report_to: the trackers every run logs to, each run
    its own tracker run grouped by the comparison (credo.integrations.tracking). `device` (resolved here once: every
    run records the same one) and `dtype` place every run and the audit; on a GPU the runs go one after another
    unless `share_gpu`. audit_n / premise_n: the preset's start audit and premise checks resized (0 skips). lora
    (LoraSettings as a dict, r > 0): every run trains LoRA adapters of those settings alike. until ('HH:MM'): runs
    that can end by then start first (grid.next_run). export_each: a folder out_dir is exported to as each run ends."""
    preset = resolve_preset(preset_name, methods, seeds, token_budget, schedule, task, eval_split, audit_n,
                            premise_n, lora)
    report_to = checked_names(report_to, "compare.report_to")
    check_trackers(report_to, "compare.report_to", TrackingPlace(out_dir, ""))  # before any timing or training
    preset, placed, jobs = place_runs(preset, device, dtype, preset.jobs if jobs is None else jobs, share_gpu,
                                      progress)
    check_start(preset, preset_name, start or "")
    deadline = time_of_day(until)  # a malformed time is refused before any timing
    after_each = _exporter(out_dir, export_each)
    start, default = start or "", "" if start else default_start(preset.task, progress)  # runs record '' (portable)
    # seed-major: an interrupted comparison has every method at its first seeds (--until may start others first)
    plan = [(m, s, os.path.join(out_dir, "runs", run_dir_name(m, s))) for s in preset.seeds for m in preset.methods]
    if is_locked(out_dir):  # before the timing: run_lock below would refuse it only after
        raise UserError(f"--out {out_dir} is being written by another credo compare; wait for it or stop it first")
    check_reusable(plan, preset, start)
    compare_eta.timed_steps(out_dir)  # a malformed estimate.json is refused now, not after minutes of timing
    results = new_results(preset_name, command, preset, start or default or f"the default start of {preset.task}",
                          placed, protocol(preset, start, jobs))
    began = time.time()
    results["estimate"] = estimate_wall_time(plan, preset, start, jobs, progress,  # the audit and premises too
                                             compare_eta.recorded_eval_seconds(out_dir, preset.eval_n, jobs),
                                             compare_eta.recorded_steps(out_dir, jobs))
    if confirm is not None:
        confirm(results["estimate"]["seconds"])
    elif progress:
        compare_eta.confirm(results["estimate"]["seconds"], yes=True, interactive=False)  # prints it
    os.makedirs(out_dir, exist_ok=True)  # only once confirmed: a refused comparison leaves nothing behind
    with run_lock(out_dir):  # a second comparison into the same --out is refused, not interleaved
        compare_eta.keep_estimate(out_dir, results["estimate"])  # for --status (methods no run has started)
        seconds = compare_eta.run_estimates(plan, preset, results["estimate"]) if until else None
        outcomes = train_all(plan, preset, start, jobs, progress, report_to, seconds, deadline, after_each)
        record_outcomes(results, preset.methods, plan, outcomes, out_dir)
        atomic_write_json(os.path.join(out_dir, "results.json"), results)
        measure_after_training(results, plan, preset, start, out_dir, placed, progress, dtype)
        results["wall_seconds"] = time.time() - began
        write_report(results, out_dir)
        if after_each is not None:  # again, with the report
            after_each()
    return results


def new_results(preset_name: str, command: str | None, preset: Preset, start: str, placed: torch.device,
                shared: dict[str, Any]) -> dict[str, Any]:
    """results.json before any run: what is compared, where, on what protocol (`shared`: protocol())."""
    return {"preset": preset_name, "command": command, "start": start, "task": preset.task, "commit": loaded_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(placed), "token_budget": preset.token_budget,
            "final_eval_n": preset.final_eval_n, "note": preset.note, "protocol": shared, "methods": {},
            "failures": {}}


def measure_after_training(results: dict[str, Any], plan: list[tuple[str, int, str]], preset: Preset, start: str,
                           out_dir: str, placed: torch.device, progress: bool, dtype: str) -> None:
    """What a comparison measures once its runs are done: the premise checks on the start and the final policies
    (preset.premise_n; a run's own were measured as it finished and are read back) and the credit audit of the
    start (preset.audit_n), each into `results`."""
    if preset.premise_n > 0:
        results["premises"] = premises_at_end(plan, preset, start, out_dir, placed, progress, dtype)
    if preset.audit_n > 0:
        results["audit"] = audit_rows(preset, start, out_dir, progress, device=device_name(placed), dtype=dtype)


def place_runs(preset: Preset, device: str, dtype: str, jobs: int, share_gpu: bool,
               progress: bool) -> tuple[Preset, torch.device, int]:
    """The preset with every run placed on `device` (resolved once: every run records the same one) in `dtype`,
    the device, and the trainings to run at once there (jobs_on)."""
    if jobs < 1:
        raise ConfigError(f"jobs (--jobs) must be >= 1, got {jobs}")
    placed = resolve_device(device, "compare.device")
    resolve_dtype(dtype, placed, "compare.dtype")
    preset = replace(preset, train={**preset.train, "device": device_name(placed), "dtype": dtype})
    return preset, placed, jobs_on(placed, jobs, share_gpu, progress)


def record_outcomes(results: dict[str, Any], methods: tuple[str, ...], plan: list[tuple[str, int, str]],
                    outcomes: list[tuple[Any, str | None]], out_dir: str) -> None:
    """Each run's result into results['methods'], and each failure into results['failures'] and its own
    traceback file: reported, never hidden; a finished run's traceback from an earlier invocation is removed."""
    results["methods"] = {method: {"seeds": {}} for method in methods}
    for (method, seed, _), (result, error) in zip(plan, outcomes):
        if error is None:
            results["methods"][method]["seeds"][str(seed)] = result
            clear_failure(out_dir, method, seed)
        else:
            results["failures"][f"{method}-s{seed}"] = error.strip().splitlines()[-1]
            atomic_write_text(failure_path(out_dir, method, seed), error)


def jobs_on(device: torch.device, jobs: int, share_gpu: bool, progress: bool = True) -> int:
    """The trainings a comparison runs at once on `device`: `jobs` on the CPU (or with share_gpu), else 1. One
    training keeps a GPU busy; `jobs` processes would each hold a copy of the model on it and time each other's
    steps (the step times a comparison reports)."""
    if device.type == "cpu" or jobs == 1 or share_gpu:
        return jobs
    if progress:
        print(f"credo compare: --jobs {jobs} on {device_name(device)} runs one training at a time (--set "
              "share_gpu=true runs them at once)", file=sys.stderr, flush=True)
    return 1


def machine(device: torch.device) -> str:
    """results.json's `machine`: the CPU count, and the GPU when the runs use one."""
    cpus = f"{os.cpu_count()} cpus"
    return cpus if device.type == "cpu" else f"{cpus}, {torch.cuda.get_device_name(device)}"


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
    try:
        with open(path) as f:
            results = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is not valid JSON ({err})") from None
    methods = results.get("methods") if isinstance(results, dict) else None
    if not isinstance(methods, dict) or not all(isinstance(e, dict) and isinstance(e.get("seeds"), dict)
                                                for e in methods.values()):
        raise UserError(f"{path} is not a credo comparison's results (no 'methods' mapping of per-seed results)")
    try:
        for method, entry in methods.items():  # runs still on disk are re-read (newer fields)
            for seed in entry["seeds"]:
                run_dir = os.path.join(out_dir, "runs", run_dir_name(method, int(seed)))
                if finished(run_dir):
                    entry["seeds"][seed] = run_result(run_dir)
                else:  # its numbers as recorded: checked as a run's own files are
                    check_run_result(entry["seeds"][seed], f"{path}: methods.{method}.seeds.{seed}")
        write_report(results, out_dir)
    except UserError:
        raise
    except KeyError as err:  # a hand-edited or truncated results.json (CREDO_DEBUG=1 shows where)
        raise UserError(f"{path} lacks the field {err} that the report needs") from None
    except (ValueError, TypeError, AttributeError) as err:
        raise UserError(f"{path} holds a value the report cannot read ({type(err).__name__}: {err})") from None
    return results


def audit_rows(preset: Preset, start: str, out_dir: str, progress: bool, device: str = "auto",
               dtype: str = "float32") -> dict[str, Any]:
    """Credit audit of the start checkpoint for the compared methods that are estimators."""
    estimators = []
    for spec in preset.methods:
        row = method_registry.credit_spec(spec)  # 'shuffled:of=rredcot' is audited with its options
        estimator = parse_spec(row)[0]
        if estimator in credit.names() and row not in estimators and estimator != "grpo":
            estimators.append(row)
    config = AuditConfig(checkpoint=start, task=preset.task, n=preset.audit_n,
                         group_size=8 if preset.audit_n >= 16 else 4,
                         k_ref=preset.audit_k_ref, methods=tuple(estimators), device=device, dtype=dtype)
    try:
        audit = run_audit(config, os.path.join(out_dir, "audit"), progress=progress)
        write_audit_page(os.path.join(out_dir, "audit"), audit)
        shutil.copy(os.path.join(out_dir, "audit", "audit.png"), os.path.join(out_dir, "audit.png"))
        return audit.report
    except Exception as err:
        return {"failure": f"{type(err).__name__}: {err}"}
