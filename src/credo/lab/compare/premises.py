"""The premise checks of a comparison, measured on its start and on every run's final policy (RL may
erode the abilities a method rests on). Which checks a method needs: credo.lab.audit.premises.premises_of; what
they measure: credo.lab.audit.premises.measure_premises. Each measurement is kept in <out>/premises/<run>.json
(start.json for the start) with the key it was measured under (the policy's weights digest, the checks, the
problems, the sampling): a rerun reads back what still matches and measures the rest again. An export
(`credo compare --export`) carries premises/ but no weights: resumed from it, a run's kept measurement is read
back under the same key apart from the weights, and a run measured nowhere is named as not measured.
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from credo.core.config import to_dict
from credo.core.files import atomic_write_json
from credo.lab.audit.premises import measure_premises, premises_of
from credo.lab.audit.reference import checkpoint_digest
from credo.lab.compare.presets import Preset, run_config, run_dir_name
from credo.policy import load_policy
from credo.policy.device import autocast_dtype, resolve_dtype
from credo.tasks import make_task
from credo.train.starts import resolve_checkpoint


GROUP = 8
"""Traces per problem (premise_n / GROUP problems)."""


def premises_at_end(plan: list[tuple[str, int, str]], preset: Preset, start: str, out_dir: str,
                    device: torch.device, progress: bool = True, dtype: str = "float32") -> dict[str, Any]:
    """{'traces', 'split', 'start': {...}, 'methods': {method: {seed: {...}}}, 'without_weights'?: [run, ...]}
    for the methods of `plan` that rest on a premise ({} when none does). A run without a final policy (failed or
    unfinished) is left out; a finished run whose final weights the folder does not hold (a record exported from
    another machine: config, log and summary only) is left out and named in 'without_weights'. A check that
    fails is reported ({'failure': ...}), never raised: the comparison's report is still written."""
    try:
        return _premises(plan, preset, start, out_dir, device, progress, dtype)
    except Exception as err:  # noqa: BLE001 (reported in results.json and the report, like the audit's failure)
        return {"failure": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def _premises(plan: list[tuple[str, int, str]], preset: Preset, start: str, out_dir: str, device: torch.device,
              progress: bool, dtype: str) -> dict[str, Any]:
    needs = _needs(preset)
    if not needs:
        return {}
    checks = _checks(preset, out_dir, device, dtype, progress)
    teacher = any(t for t, _ in needs.values())
    localisers = sorted({loc for _, loc in needs.values() if loc})
    sampling = run_config(plan[0][0], preset.seeds[0], preset, start).sampling
    out: dict[str, Any] = {"traces": len(checks.problems) * GROUP,
                           "split": "validation" if checks.validation else "held-out", "methods": {}}
    checkpoint = resolve_checkpoint(start, "compare.start", task=preset.task, progress=progress)
    out["start"] = checks.measured("start", checkpoint, sampling, 0, teacher, localisers)
    for method, seed, run_dir in plan:
        if method not in needs or not os.path.isfile(os.path.join(run_dir, "summary.json")):
            continue
        result = _run_measured(checks, needs[method], method, seed, run_dir, preset, start)
        if result is None:  # an exported record, measured nowhere this folder knows of
            out.setdefault("without_weights", []).append(run_dir_name(method, seed))
        else:
            out["methods"].setdefault(method, {})[str(seed)] = result
    return out


PENDING = ".pending"
"""premises/<run>.pending: the run rests on a premise its checks have not yet measured (written before it trains,
removed once they are kept or have failed): an export made meanwhile says so."""


def needs_checks(method: str, preset: Preset) -> bool:
    """Whether a run of `method` is checked at its end (premise_n > 0 and the method rests on a premise)."""
    return preset.premise_n > 0 and method in _needs(preset)


def pending_path(run_dir: str) -> str:
    """premises/<run>.pending of the comparison that holds run_dir (<out>/runs/<run>)."""
    return os.path.join(out_dir_of(run_dir), "premises", os.path.basename(os.path.normpath(run_dir)) + PENDING)


def premises_of_finished_run(method: str, seed: int, preset: Preset, start: str, run_dir: str) -> None:
    """The premise checks of one finished run's final policy, measured as soon as it finishes and kept in
    <out>/premises/<run>.json (nothing unless needs_checks). An export made before the whole comparison ends then
    carries them, although the weights they were measured on stay behind; the comparison's end reads them back
    (premises_at_end) under the same key. They run in the run's worker, at its threads (one per core shared
    out), where the end's measurements of the start and of any run left unmeasured use the main process's: the
    same checks, rounded by another number of threads. Raises what the checks raise (the caller reports it)."""
    if not needs_checks(method, preset):
        return
    device = torch.device(preset.train.get("device", "cpu"))
    checks = _checks(preset, out_dir_of(run_dir), device, preset.train.get("dtype", "float32"), progress=False)
    _run_measured(checks, _needs(preset)[method], method, seed, run_dir, preset, start)


def out_dir_of(run_dir: str) -> str:
    """The comparison folder of one of its runs (<out>/runs/<run>)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))


def _needs(preset: Preset) -> dict[str, tuple[bool, str | None]]:
    """{method: (teacher, localiser)} of the preset's methods that rest on a premise."""
    needs = {m: premises_of(m) for m in preset.methods}
    return {m: (teacher, loc) for m, (teacher, loc) in needs.items() if teacher or loc}


def _checks(preset: Preset, out_dir: str, device: torch.device, dtype: str, progress: bool) -> "PremiseChecks":
    """The comparison's premise checks: premise_n // GROUP problems of the split its runs evaluate on."""
    task = make_task(preset.task, preset.train.get("task_options", {}), prefix="compare.task_options.")
    validation = preset.train.get("eval_split") == "validation"  # the held-out set is then never read
    n = max(preset.premise_n // GROUP, 1)
    problems = task.validation_problems(n) if validation else task.heldout_problems(n)
    folder = os.path.join(out_dir, "premises")
    os.makedirs(folder, exist_ok=True)
    return PremiseChecks(task, problems, validation, folder, device, dtype, progress)


def _run_measured(checks: "PremiseChecks", need: tuple[bool, str | None], method: str, seed: int, run_dir: str,
                  preset: Preset, start: str) -> dict | None:
    """One finished run's checks: kept, or measured on its final/ weights; None for a record without them."""
    final = os.path.join(run_dir, "final")
    teacher, localiser = need
    return checks.measured(run_dir_name(method, seed), final if os.path.isdir(final) else None,
                           run_config(method, seed, preset, start).sampling, seed, teacher,
                           [localiser] if localiser else [])


@dataclass(frozen=True)
class PremiseChecks:
    """Where and on what a comparison's premise checks run: `problems` of `task` (the validation split's when
    `validation`), each policy's results kept in `folder` under a key of what they depend on."""

    task: Any
    problems: list[Any]
    validation: bool
    folder: str
    device: torch.device
    dtype: str
    progress: bool

    def measured(self, name: str, checkpoint: str | None, sampling: Any, seed: int, teacher: bool,
                 localisers: list[str]) -> dict | None:
        """The checks on `checkpoint`'s policy: read back when kept under the same key, else measured and kept.
        checkpoint None (a finished run's record without its weights): only read back, the weights not compared."""
        device, dtype = self.device, self.dtype
        key = {"weights": checkpoint_digest(checkpoint) if checkpoint else None, "teacher": teacher,
               "localisers": localisers, "problems": len(self.problems),
               "split": "validation" if self.validation else "held-out", "sampling": to_dict(sampling), "seed": seed,
               # off the CPU's float32 the numbers differ (docs/gpu.md); float32 CPU keys are as they were
               **({"device": device.type, "dtype": dtype} if device.type != "cpu" or dtype != "float32" else {})}
        path = os.path.join(self.folder, f"{name}.json")
        kept = _kept(path, key)
        if kept is not None or checkpoint is None:
            return kept
        if self.progress:
            print(f"compare: premise checks of {name} ...", flush=True)
        placed = resolve_dtype(dtype, device, "compare.dtype")
        policy = load_policy(checkpoint, device=device, dtype=placed, autocast=autocast_dtype(dtype))
        policy.model.eval()
        result = measure_premises(policy, self.task, self.problems, GROUP, sampling, seed, teacher, localisers)
        atomic_write_json(path, {"key": key, "result": result})
        return result


def _kept(path: str, key: dict[str, Any]) -> dict[str, Any] | None:
    """The result kept at `path` when it was measured under `key`, its weights digest not compared when
    key['weights'] is None (the weights are not in this folder: a record exported with its premises/); else None."""
    try:
        with open(path) as f:
            kept = json.load(f)
    except (OSError, ValueError):
        return None  # absent or unreadable: our own file, measured again
    if not isinstance(kept, dict) or not isinstance(kept.get("key"), dict):
        return None
    ignore = {"weights"} if key["weights"] is None else set()

    def compared(k: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in k.items() if name not in ignore}
    return kept.get("result") if compared(kept["key"]) == compared(key) else None
