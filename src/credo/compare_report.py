"""What a comparison's numbers say: per-method summaries, the goal checks, report.md and the plots.

Everything here is a pure function of results.json's content (plus matplotlib), so a finished
comparison's report can be rebuilt without training (`credo compare --report-only`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from credo import methods as method_registry

def tokens_to_reach(curve: list[dict[str, Any]], target: float) -> int | None:
    for point in curve:
        if point["accuracy"] >= target and point["tokens_generated"] > 0:
            return point["tokens_generated"]
    return None


def summarise(results: dict[str, Any]) -> None:
    """Adds mean/std of finals, tokens-to-GRPO-final and step-time ratios to each method."""
    grpo = results["methods"].get("grpo", {}).get("seeds", {})
    grpo_finals = [r["final_accuracy"] for r in grpo.values()]
    target = statistics.mean(grpo_finals) if grpo_finals else math.nan
    grpo_tokens = [tokens_to_reach(r["curve"], target) for r in grpo.values()]
    grpo_tokens_mean = statistics.mean([t for t in grpo_tokens if t]) if any(grpo_tokens) else math.nan
    grpo_step = statistics.mean([r["seconds_per_step"] for r in grpo.values()]) if grpo else math.nan
    results["grpo_final_target"] = target
    for name, entry in results["methods"].items():
        runs = entry["seeds"]
        finals = [r["final_accuracy"] for r in runs.values()]
        for r in runs.values():
            r["tokens_to_grpo_final"] = tokens_to_reach(r["curve"], target)
        reached = [r["tokens_to_grpo_final"] for r in runs.values() if r["tokens_to_grpo_final"]]
        entry["final_mean"] = statistics.mean(finals) if finals else None
        entry["final_std"] = statistics.stdev(finals) if len(finals) > 1 else 0.0 if finals else None
        # paired by seed: a seed fixes the prompt order, so the difference cancels part of the prompt noise
        deltas = [r["final_accuracy"] - grpo[seed]["final_accuracy"] for seed, r in runs.items() if seed in grpo]
        entry["delta_vs_grpo_mean"] = statistics.mean(deltas) if deltas else None
        entry["delta_vs_grpo_std"] = statistics.stdev(deltas) if len(deltas) > 1 else 0.0 if deltas else None
        entry["seeds_reaching_grpo_final"] = len(reached)
        # the mean over the seeds that got there; `seeds_reaching_grpo_final` says how many did
        entry["tokens_to_grpo_final_ratio"] = (statistics.mean(reached) / grpo_tokens_mean
                                               if reached and grpo_tokens_mean == grpo_tokens_mean else None)
        entry["step_time_ratio"] = (statistics.mean([r["seconds_per_step"] for r in runs.values()]) / grpo_step
                                    if runs and grpo_step == grpo_step else None)


def _fmt(value: Any, pattern: str = "{:.3f}") -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)


def report(results: dict[str, Any]) -> str:
    audit = results.get("audit", {}).get("methods", {})
    lines = [f"# credo compare ({results['preset']})", "",
             f"Start `{results['start']}` · budget {results['token_budget']:,} generated tokens per run · "
             f"commit `{results['commit'][:10]}` · {results['date']} · {results['machine']}"
             + (f" · {results['wall_seconds'] / 60:.0f} min wall" if results.get("wall_seconds") else ""), "",
             *([f"Command: `{results['command']}`", ""] if results.get("command") else []),
             "| method | final accuracy (mean ± std) | Δ vs GRPO, paired by seed | tokens to GRPO's final (× GRPO; seeds reaching) | step time (× GRPO) | audit spearman | audit first_error_top1 | audit cost (× trace) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, entry in results["methods"].items():
        estimator = method_registry.resolve(name).estimator
        # a recipe on GRPO advantages (dapo, gspo, rrpo, srpo) has no credit of its own to audit
        a = audit.get(estimator, {}) if (estimator != "grpo" or name == "grpo") else {}
        n = len(entry["seeds"])
        if entry.get("final_mean") is None:
            final, delta, reach = "failed", "—", "—"
        else:
            final = f"{entry['final_mean']:.3f} ± {entry['final_std']:.3f} ({n} seed{'s' if n != 1 else ''})"
            delta = f"{entry['delta_vs_grpo_mean']:+.3f} ± {entry['delta_vs_grpo_std']:.3f}"
            reach = f"{_fmt(entry.get('tokens_to_grpo_final_ratio'), '{:.2f}')} ({entry['seeds_reaching_grpo_final']}/{n})"
        lines.append(f"| {name} | {final} | {delta} | {reach} | "
                     f"{_fmt(entry.get('step_time_ratio'), '{:.2f}')} | {_fmt(a.get('spearman'))} | "
                     f"{_fmt(a.get('first_error_top1'))} | {_fmt(a.get('cost_vs_grpo_step'), '{:.2f}')} |")
    for run, why in results["failures"].items():
        lines.append(f"| {run} | failed: {why} | | | | | | |")
    lines += ["", "## Reading", "", reading(results)]
    return "\n".join(lines) + "\n"


BASELINES = ("grpo", "dr_grpo", "rloo", "dapo", "gspo")


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The seed papers' claims, checked at our scale: each {goal, holds, evidence}; holds is None with
    fewer than 2 seeds. A difference counts only when it exceeds the seeds' spread."""
    entries = {k: v for k, v in results["methods"].items() if v.get("final_mean") is not None}
    out: list[dict[str, Any]] = []
    credit_methods = {k: v for k, v in entries.items() if k not in BASELINES}
    if "grpo" in entries and credit_methods:
        name, best = max(credit_methods.items(), key=lambda kv: kv[1]["final_mean"])
        ratio, n = best.get("tokens_to_grpo_final_ratio"), len(best["seeds"])
        holds = (ratio is not None and best["seeds_reaching_grpo_final"] == n and ratio <= 0.5
                 and best["delta_vs_grpo_mean"] >= 0.05)
        out.append({"goal": "the best credit method reaches GRPO's final accuracy with <= 0.5x the generated tokens "
                            "and ends >= +5 points above it", "holds": holds,
                    "evidence": f"best credit method {name}: {best['delta_vs_grpo_mean']:+.3f} ± "
                                f"{best['delta_vs_grpo_std']:.3f} vs GRPO, tokens to GRPO's final "
                                f"{_fmt(ratio, '{:.2f}')}x ({best['seeds_reaching_grpo_final']}/{n} seeds reach it)"})
    if "grpo" in entries and "sc_grpo" in entries:
        e = entries["sc_grpo"]
        out.append({"goal": "SC-GRPO ends above GRPO", "holds": e["delta_vs_grpo_mean"] > max(e["delta_vs_grpo_std"], 1e-9),
                    "evidence": f"sc_grpo {e['delta_vs_grpo_mean']:+.3f} ± {e['delta_vs_grpo_std']:.3f} vs GRPO "
                                f"(paired over {len(e['seeds'])} seeds)"})
    if "srpo" in entries and "rrpo" in entries:
        s_, r_ = entries["srpo"], entries["rrpo"]
        def tokens(e: dict) -> float:  # never reaching counts as the whole budget
            runs = e["seeds"].values()
            return statistics.mean([r["tokens_to_grpo_final"] or results["token_budget"] for r in runs])
        ts, tr = tokens(s_), tokens(r_)
        out.append({"goal": "SRPO reaches GRPO's final accuracy sooner than RRPO",
                    "holds": ts < tr and s_["seeds_reaching_grpo_final"] >= r_["seeds_reaching_grpo_final"],
                    "evidence": f"generated tokens to GRPO's final, mean over seeds (budget when never): srpo {ts:,.0f} "
                                f"({s_['seeds_reaching_grpo_final']}/{len(s_['seeds'])} reach), rrpo {tr:,.0f} "
                                f"({r_['seeds_reaching_grpo_final']}/{len(r_['seeds'])} reach)"})
    if min((len(v["seeds"]) for v in entries.values()), default=0) < 2:
        for check in out:  # one seed has no spread to weigh a difference against
            check["holds"] = None
    return out


def reading(results: dict[str, Any]) -> str:
    entries = {k: v for k, v in results["methods"].items() if v.get("final_mean") is not None}
    if "grpo" not in entries:
        return "GRPO failed, so nothing can be read against it."
    g = entries["grpo"]
    best = max(entries.items(), key=lambda kv: kv[1]["final_mean"])
    seeds = max(len(v["seeds"]) for v in entries.values())
    parts = [f"GRPO ends at {g['final_mean']:.3f}. The best final accuracy is {best[0]}'s {best[1]['final_mean']:.3f} "
             f"({best[1]['final_mean'] - g['final_mean']:+.3f})."]
    faster = [k for k, v in entries.items() if k != "grpo" and v.get("tokens_to_grpo_final_ratio") is not None
              and v["seeds_reaching_grpo_final"] == len(v["seeds"]) and v["tokens_to_grpo_final_ratio"] < 0.995]
    if faster:
        parts.append("Reached GRPO's final accuracy on every seed with fewer generated tokens: " + ", ".join(
            f"{k} ({entries[k]['tokens_to_grpo_final_ratio']:.2f}x)" for k in faster) + ".")
    n_eval = results.get("final_eval_n", 500)
    se = (0.25 / n_eval) ** 0.5
    parts.append(f"One final evaluation on {n_eval} problems has a standard error of up to {se:.3f}; "
                 + (f"with {seeds} seed(s), differences under ~{2 * se * 2 ** 0.5:.2f} are not evidence; run "
                    f"`--preset full` (3 seeds) before drawing conclusions." if seeds < 3 else
                    "read a difference as real only where it exceeds the spread over seeds."))
    text = " ".join(parts)
    checks = goals(results)
    if checks:
        text += "\n\n## Goals (the seed papers' claims at our scale)\n\n| goal | holds | evidence |\n|---|---|---|\n"
        verdict = {True: "yes", False: "no", None: "not judged (needs >= 2 seeds)"}
        text += "\n".join(f"| {c['goal']} | {verdict[c['holds']]} | {c['evidence']} |" for c in checks)
    return text


def _mean_curve(entry: dict[str, Any], x: str = "tokens_generated") -> tuple[list[float], list[float], list[float], list[float]] | None:
    """Mean, min and max accuracy over seeds at each evaluation, aligned by evaluation index (the
    k-th crossing of the eval interval), at the mean token count of that evaluation."""
    runs = [[p for p in r["curve"] if not p.get("final")] for r in entry["seeds"].values() if r.get("curve")]
    runs = [c for c in runs if c and all(x in p for p in c)]
    if not runs:
        return None
    length = min(len(c) for c in runs)
    xs = [statistics.mean(c[i][x] for c in runs) for i in range(length)]
    ys = [[c[i]["accuracy"] for c in runs] for i in range(length)]
    return xs, [statistics.mean(y) for y in ys], [min(y) for y in ys], [max(y) for y in ys]


def plot_curves(results: dict[str, Any], path: str, x: str = "tokens_generated") -> None:
    """One panel per method (mean over seeds, band min-max), GRPO in grey in every panel; x is
    generated tokens (the budget every method shares) or `step` (policy updates)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    label = {"tokens_generated": "generated tokens", "step": "policy updates"}[x]
    curves = {name: c for name, entry in results["methods"].items() if (c := _mean_curve(entry, x))}
    if not curves:
        return
    cols = min(4, len(curves))
    rows = math.ceil(len(curves) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), sharex=True, sharey=True, squeeze=False)
    lows = [v for c in curves.values() for v in c[2]]
    highs = [v for c in curves.values() for v in c[3]]
    for ax, (name, (xs, mean, low, high)) in zip(axes.flat, curves.items()):
        if name != "grpo" and "grpo" in curves:
            gx, gm, gl, gh = curves["grpo"]
            ax.plot(gx, gm, color="0.55", lw=1.2, label="grpo")
            ax.fill_between(gx, gl, gh, color="0.55", alpha=0.15)
        ax.plot(xs, mean, color="C0" if name == "grpo" else "C3", marker="o", ms=3, lw=1.6, label=name)
        ax.fill_between(xs, low, high, color="C0" if name == "grpo" else "C3", alpha=0.2)
        n = len(results["methods"][name]["seeds"])
        ax.set_title(f"{name} ({n} seed{'s' if n != 1 else ''})", fontsize=10)
        ax.grid(alpha=0.3)
        ax.set_ylim(min(lows) - 0.01, max(highs) + 0.01)
    for ax in axes.flat[len(curves):]:
        ax.axis("off")
    bottom = [axes[min(r, (len(curves) - 1 - c) // cols), c] for c in range(cols) for r in [rows - 1]]
    for ax in bottom:  # the lowest used panel of each column carries the x axis
        ax.tick_params(labelbottom=True)
        ax.set_xlabel(label)
        if x == "tokens_generated":
            ax.ticklabel_format(axis="x", style="sci", scilimits=(3, 3))
    if x == "step":  # MC methods make a handful of updates in the budget: a log axis keeps them visible
        for ax in axes.flat:
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlim(left=0)
    for ax in axes[:, 0]:
        ax.set_ylabel("held-out accuracy")
    fig.suptitle(f"held-out greedy accuracy vs {label} (mean over seeds; band: min-max; grey: GRPO)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
