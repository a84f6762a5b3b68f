"""The report's section on the premise checks a comparison measured on its start and at the end of training
(credo.lab.compare.premises)."""

from __future__ import annotations

from typing import Any, Callable

from credo.lab.compare.stats import figure


def _mean(values: list[float]) -> float:
    values = [v for v in values if v == v]  # NaN (nothing to measure on a seed) left out
    return sum(values) / len(values) if values else float("nan")


def premise_lines(results: dict[str, Any], shown: Callable[[str], str]) -> list[str]:
    """The premise checks on the start and at the end of training (credo.lab.compare.premises), each method's
    figures the mean over its seeds; nothing when the comparison measured none. shown: a method's name as the
    report's tables show it (marked † when privileged)."""
    premises = results.get("premises") or {}
    if premises.get("failure"):
        return ["## Premises at the start and at the end of training", "",
                f"Not measured: {premises['failure']} (results.json holds the traceback).", ""]
    if not premises.get("start"):
        return []
    lines = ["## Premises at the start and at the end of training", "",
             f"Measured on {premises['traces']} traces of {premises.get('split', 'held-out')} problems sampled from "
             "each policy (docs/methods.md, "
             "'Premise checks'): the teacher's gain in log p of its own verified solutions with them in context "
             "(> 0: it reads them) and the share of wrong traces whose largest-KL token is in the first wrong step; "
             "the localiser's parse rate, first-error top-1 and step-1 share on wrong traces. RL may erode both.", "",
             "| policy | seeds | trace accuracy | teacher gain / solution (nats) | KL argmax in first wrong step "
             "(uniform token) | localiser | parse rate | first-error top-1 (uniform guess) | step-1 share (oracle) |",
             "|---|---|---|---|---|---|---|---|---|"]

    lines += _rows("start", [premises["start"]])
    for method, seeds in premises.get("methods", {}).items():
        lines += _rows(shown(method), list(seeds.values()))
    if premises.get("without_weights"):
        lines += ["", f"Not measured: {', '.join(premises['without_weights'])}: finished runs whose final weights "
                  "this folder does not hold (an exported record, or weights removed) and no measurement of which "
                  "was kept under the same settings; the seeds column counts the runs measured."]
    return lines + [""]


def _avg(runs: list[dict[str, Any]], *keys: str) -> float:
    """The mean over `runs` of the figure at the path `keys` (a run without it counts as NaN, left out)."""
    out = []
    for run in runs:
        value: Any = run
        for key in keys:
            value = (value or {}).get(key) if isinstance(value, dict) else None
        out.append(float("nan") if value is None else float(value))
    return _mean(out)


def _rows(label: str, runs: list[dict[str, Any]]) -> list[str]:
    """The table's rows of one policy (`label`), one per localiser it was checked with, over its seeds' `runs`."""
    teacher = any("teacher" in run for run in runs)
    names = sorted({name for run in runs for name in run.get("localisers", {})}) or [None]
    out = []
    for name in names:
        loc = ("localisers", name)
        failed = name is not None and any("failure" in run.get("localisers", {}).get(name, {}) for run in runs)
        name = f"{name} (failed on some seed: results.json says why)" if failed else name
        out.append(f"| {label} | {len(runs)} | {figure(_avg(runs, 'accuracy'))} | "
                   + (f"{figure(_avg(runs, 'teacher', 'gain_per_solution'), '{:+.1f}')} | "
                      f"{figure(_avg(runs, 'teacher', 'kl_argmax_in_first_error'))} "
                      f"({figure(_avg(runs, 'teacher', 'kl_argmax_uniform'))})" if teacher else "— | —")
                   + (f" | {name} | {figure(_avg(runs, *loc, 'parse_rate'), '{:.2f}')} | "
                      f"{figure(_avg(runs, *loc, 'localisation_top1'))} "
                      f"({figure(_avg(runs, *loc, 'random_top1_expectation'))}) | "
                      f"{figure(_avg(runs, *loc, 'step1_share'))} ({figure(_avg(runs, *loc, 'oracle_step1_share'))}) |"
                      if name else " | — | — | — | — |"))
    return out
