"""The clip-off check's table: the same methods, seeds and protocol trained with gradient-norm clipping (a finished
`credo compare` folder, e.g. docs/results/compare-long-skilled) and without it (`--set grad_clip=1000000`), one row
per method found in both.

A row pairs the two folders' runs by their recorded settings (all but the clip and where they ran) and seed: its
final accuracy with and without clipping, the paired difference (unclipped - clipped) with its raw 95% t interval
and its Holm-adjusted p over the rows (the family: every method's clip-off difference), the share of steps whose
pre-clip gradient norm exceeds the clipped folder's clip (in the unclipped runs: the steps clipping would have
rescaled), the median gradient norms, and the median update size after AdamW where the runs logged it. Runs are
matched on the settings both recorded (a record from before an option existed lacks it); an unclipped run without a
finished twin is named and left out.

    python scripts/clip_off_table.py docs/results/compare-long-skilled docs/results/compare-clip-off
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from credo.core.files import MetricsLog
from credo.lab.compare.presets import run_dir_name
from credo.lab.compare.runs import recorded_config, run_result
from credo.lab.compare.stats import clipping, correct_family, paired


# what a clip-off run may record differently from its clipped twin: the setting under test and where it ran
UNCOMPARED = ("grad_clip", "report_to", "device", "data_parallel")


def finished_runs(folder: str) -> list[dict[str, Any]]:
    """Every finished run under FOLDER/runs: {name, label, config, seed, grad_clip, result, norms} (label: its
    method as FOLDER/results.json names it; norms: the per-step pre-clip gradient norms, for the share above another
    folder's clip)."""
    runs = []
    root = os.path.join(folder, "runs")
    results = os.path.join(folder, "results.json")
    specs: list[str] = []
    if os.path.isfile(results):
        with open(results) as f:
            specs = list(json.load(f)["methods"])
    for name in sorted(os.listdir(root)):
        run_dir = os.path.join(root, name)
        if not os.path.isfile(os.path.join(run_dir, "summary.json")):
            continue
        config = recorded_config(run_dir)
        rows = MetricsLog(os.path.join(run_dir, "metrics.jsonl")).rows()
        seed = int(config["seed"])
        # the method as the comparison named it ('ibpo:preserve_mass=true'); a folder without results.json: its name
        label = next((s for s in specs if run_dir_name(s, seed) == name), name.rsplit("-s", 1)[0])
        runs.append({"name": name, "label": label, "config": config, "seed": seed,
                     "grad_clip": float(config["grad_clip"]), "result": run_result(run_dir),
                     "norms": [float(r["grad_norm"]) for r in rows if r.get("step", 0) > 0 and "grad_norm" in r]})
    return runs


def agree(a: Any, b: Any) -> bool:
    """Whether two recorded settings agree on everything both recorded: mappings key by key on their shared keys
    (a record from before an option existed lacks it; an empty mapping is one that recorded none), else equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(agree(a[k], b[k]) for k in set(a) & set(b))
    return a == b


def same_run(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs train one method on one seed: every recorded setting but UNCOMPARED agrees."""
    drop = lambda config: {k: v for k, v in config.items() if k not in UNCOMPARED}  # noqa: E731
    return agree(drop(a["config"]), drop(b["config"]))


def rows(clipped: list[dict[str, Any]], unclipped: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method of the unclipped folder that the clipped folder also ran, on the seeds both finished.
    An unclipped run with no twin is named on stderr; one with more than one twin (records too sparse to tell the
    methods apart) is an error."""
    table: list[dict[str, Any]] = []
    for run in unclipped:
        twins = [c for c in clipped if same_run(c, run)]
        if len(twins) != 1:
            if twins:
                raise SystemExit(f"clip_off_table: {run['name']} matches {len(twins)} clipped runs "
                                 f"({', '.join(t['name'] for t in twins)}); their records cannot tell them apart")
            print(f"clip_off_table: {run['name']}: no clipped run of the same method and seed (left out)",
                  file=sys.stderr)
            continue
        label = twins[0]["label"]
        row = next((r for r in table if r["label"] == label), None)
        if row is None:
            row = {"label": label, "runs": []}
            table.append(row)
        row["runs"].append((twins[0], run))
    for row in table:
        pairs = row["runs"]
        clip = pairs[0][0]["grad_clip"]
        row.update(seeds=[u["seed"] for _, u in pairs], clip=clip,
                   on=statistics.mean(c["result"]["final_accuracy"] for c, _ in pairs),
                   off=statistics.mean(u["result"]["final_accuracy"] for _, u in pairs),
                   delta=paired([u["result"]["final_accuracy"] - c["result"]["final_accuracy"] for c, u in pairs]),
                   on_share=statistics.mean(clipping(c["norms"], clip)["clipped_share"] for c, _ in pairs),
                   off_share=statistics.mean(clipping(u["norms"], clip)["clipped_share"] for _, u in pairs),
                   on_norm=statistics.median(statistics.median(c["norms"]) for c, _ in pairs),
                   off_norm=statistics.median(statistics.median(u["norms"]) for _, u in pairs),
                   off_update=median_or_none([u["result"].get("update_norm_median") for _, u in pairs]))
    correct_family([row["delta"] for row in table], "every method's final accuracy, unclipped - clipped")
    return table


def median_or_none(values: list[float | None]) -> float | None:
    return statistics.median(values) if values and all(v is not None for v in values) else None


def markdown(table: list[dict[str, Any]]) -> str:
    head = ("| method | seeds | final, clipped | final, unclipped | Δ unclipped - clipped, raw 95% t | Holm p | "
            "steps above the clip, clipped / unclipped | median grad norm, clipped / unclipped | "
            "median update after AdamW, unclipped |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in table:
        d = r["delta"]
        ci = f"[{100 * d['ci'][0]:+.1f}, {100 * d['ci'][1]:+.1f}]" if d.get("ci") else "(one seed: no interval)"
        holm = f"{d['p_holm']:.3f}" if "p_holm" in d else "—"
        update = f"{r['off_update']:.4f}" if r["off_update"] is not None else "—"
        lines.append(f"| {r['label']} | {','.join(map(str, r['seeds']))} | {r['on']:.3f} | {r['off']:.3f} | "
                     f"{100 * d['mean']:+.1f} {ci} | {holm} | {r['on_share']:.0%} / {r['off_share']:.0%} | "
                     f"{r['on_norm']:.2f} / {r['off_norm']:.2f} | {update} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("clipped", help="a credo compare folder trained with clipping (its runs/ is read)")
    parser.add_argument("unclipped", help="the same methods and seeds trained without it")
    args = parser.parse_args(argv)
    for folder in (args.clipped, args.unclipped):
        if not os.path.isdir(os.path.join(folder, "runs")):
            print(f"clip_off_table: {folder}: no runs/ folder (give a credo compare output folder)", file=sys.stderr)
            return 2
    table = rows(finished_runs(args.clipped), finished_runs(args.unclipped))
    if not table:
        print("clip_off_table: no method and seed finished in both folders", file=sys.stderr)
        return 1
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
