"""The SmolLM2-135M learning curves of docs/results/smollm2/ as one PNG: held-out greedy accuracy against
GRPO steps, for the run at lr 2e-6 (from the 15-step SFT start) and the one at the tiny GPT's lr 2e-5 (from
the 6-step start), which collapsed. Reads the committed metrics; trains nothing.

Usage: python bench/smollm2_curve.py [--results docs/results/smollm2]
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from credo.core.files import read_jsonl  # noqa: E402

RUNS = {"grpo-lr2e-6": "GRPO, lr 2e-6 (15-step SFT start)", "grpo-lr2e-5-collapse": "GRPO, lr 2e-5 (6-step SFT start)"}


def curve(run_dir: str) -> tuple[list[int], list[float], tuple[int, float] | None]:
    """(steps, accuracy on the curve's 100 problems, (step, final accuracy on 300) if the run finished)."""
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))  # committed as metrics.jsonl.xz
    points = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    summary = os.path.join(run_dir, "summary.json")
    final = None
    if os.path.exists(summary):
        s = json.load(open(summary))
        final = (s["step"], s["final_accuracy"])
    return [p[0] for p in points], [p[1] for p in points], final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results",
                        default=os.path.join(os.path.dirname(__file__), "..", "docs", "results", "smollm2"))
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for name, label in RUNS.items():
        steps, accuracy, final = curve(os.path.join(args.results, name))
        line, = ax.plot(steps, accuracy, marker="o", label=label)
        if final:
            ax.plot([final[0]], [final[1]], marker="*", markersize=12, color=line.get_color(), linestyle="none",
                    label=f"final, 300 problems: {final[1]:.3f}")
    ax.axhline(0.44, color="grey", linestyle="--", linewidth=1, label="15-step SFT start, 300 problems: 0.440")
    ax.set_xlabel("GRPO step (2 prompts x 4 completions, one update each)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("SmolLM2-135M on gym:chain_sum (3-4 one-digit terms), 2 CPU cores")
    ax.set_ylim(-0.02, 0.7)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = os.path.join(args.results, "curve.png")
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
