"""The plots of a comparison: accuracy per method against GRPO, by generated tokens or by policy updates.

Pure functions of results.json's content (plus matplotlib), like compare_report.py.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from typing import Any

from credo.lab.compare.goals import privilege_mark
from credo.lab.figures import save_figure


def _mean_curve(entry: dict[str, Any],
                x: str = "tokens_generated") -> tuple[list[float], list[float], list[float], list[float]] | None:
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


def panel_title(name: str, seeds: int, privileged: bool | None = False, width: int = 34) -> str:
    """'rredcot † (5 seeds)' (†? where privileged is None: a method this version cannot tell), broken into lines of
    <= width characters at the spec's ':' (a long composed spec such as
    shuffled:of=tempo:options.of=rredcot:include_reference=false would run into the next panel's title)."""
    mark = privilege_mark(privileged)
    text = f"{name}{' ' + mark if mark else ''} ({seeds} seed{'s' if seeds != 1 else ''})"
    lines = [""]
    for part in text.replace(":", ":\n").split("\n"):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def eval_set(results: dict[str, Any]) -> str:
    """Where the curves were measured: 'validation' (training-split problems no run trained on) or 'held-out'."""
    return "validation" if results.get("protocol", {}).get("eval_split") == "validation" else "held-out"


def plot_curves(results: dict[str, Any], path: str, x: str = "tokens_generated") -> None:
    """One panel per method (mean over seeds, band min-max), GRPO in grey in every panel; x is
    generated tokens (the budget every method shares) or `step` (policy updates)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    label = {"tokens_generated": "generated tokens", "step": "policy updates"}[x]
    split = eval_set(results)
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
        entry = results["methods"][name]
        ax.set_title(panel_title(name, len(entry["seeds"]), entry.get("privileged", False)), fontsize=9)
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
        ax.set_ylabel(f"{split} accuracy")
    title = f"{split} greedy accuracy vs {label} (mean over seeds; band: min-max; grey: GRPO)"
    fig.suptitle(textwrap.fill(title, width=34 * cols), fontsize=11)  # a 3.2-inch panel holds ~36 characters
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
