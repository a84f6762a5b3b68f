"""The premise checks of a comparison, measured on its start and on every run's final policy (issue 37: RL may
erode the abilities a method rests on). Which checks a method needs: credo.lab.audit.premises.premises_of; what
they measure: credo.lab.audit.premises.measure_premises. Each measurement is kept in
<out>/premises/<run>.json (start.json for the start), so a rerun of the comparison measures only what is missing.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from credo.core.config import UserError
from credo.core.files import atomic_write_json
from credo.lab.audit.premises import measure_premises, premises_of
from credo.lab.compare.presets import Preset, run_config, run_dir_name

GROUP = 8
"""Traces per held-out problem (premise_n / GROUP problems)."""


def premises_at_end(plan: list[tuple[str, int, str]], preset: Preset, start: str, out_dir: str,
                    device: torch.device, progress: bool = True) -> dict[str, Any]:
    """{'start': {...}, 'methods': {method: {seed: {...}}}} for the methods of `plan` that rest on a premise
    (nothing when none does); a run without a final policy (failed or unfinished) is left out."""
    from credo.policy import load_policy
    from credo.tasks import make_task
    from credo.train.starts import resolve_checkpoint
    needs = {m: premises_of(m) for m in preset.methods}
    needs = {m: (teacher, localiser) for m, (teacher, localiser) in needs.items() if teacher or localiser}
    if not needs:
        return {}
    teacher = any(t for t, _ in needs.values())
    localisers = sorted({loc for _, loc in needs.values() if loc})
    task = make_task(preset.task, preset.train.get("task_options", {}), prefix="compare.task_options.")
    problems = task.heldout_problems(max(preset.premise_n // GROUP, 1))
    folder = os.path.join(out_dir, "premises")
    os.makedirs(folder, exist_ok=True)

    def measured(name: str, checkpoint: str, sampling: Any, seed: int, checks: tuple[bool, list[str]]) -> dict:
        path = os.path.join(folder, f"{name}.json")
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    return json.load(f)
            except (OSError, ValueError) as err:
                raise UserError(f"{path}: unreadable ({err}); remove it to measure it again") from None
        if progress:
            print(f"compare: premise checks of {name} ...", flush=True)
        policy = load_policy(checkpoint, device=device)
        policy.model.eval()
        result = measure_premises(policy, task, problems, GROUP, sampling, seed, *checks)
        atomic_write_json(path, result)
        return result

    first = plan[0][0]
    sampling = run_config(first, preset.seeds[0], preset, start).sampling
    out: dict[str, Any] = {"traces": len(problems) * GROUP, "methods": {}}
    out["start"] = measured("start", resolve_checkpoint(start, "compare.start", task=preset.task, progress=progress),
                            sampling, 0, (teacher, localisers))
    for method, seed, run_dir in plan:
        final = os.path.join(run_dir, "final")
        if method not in needs or not os.path.isfile(os.path.join(run_dir, "summary.json")):
            continue
        own_teacher, own_localiser = needs[method]
        checks = (own_teacher, [own_localiser] if own_localiser else [])
        sampling = run_config(method, seed, preset, start).sampling
        out["methods"].setdefault(method, {})[str(seed)] = measured(run_dir_name(method, seed), final, sampling, seed,
                                                                    checks)
    return out
