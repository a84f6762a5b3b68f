"""Calibration of a step-labelled testbed task (default `arith-long`) on its SFT start.

Measures, and checks against the goals set beforehand:
  - held-out greedy accuracy (goal 0.25-0.45);
  - where the labelled first errors fall (goal: no step position holds > 25% of them), on the audit's
    sampled traces (temperature 1, the traces credit is judged on) and on greedy traces;
  - how sharp the MC reference is: split-half Spearman over all segments at K_ref (goal >= 0.85),
    the share of wrong traces whose MC value drops by >= 0.15 at the labelled error (goal >= 60%),
    and, as the first-error-based reliability, the reference's own first-error top-1 and the
    agreement of its two halves on the most negative segment;
  - the SFT minutes (from the start's sft_summary.json).
The reference is built with `credo.lab.audit.run.build_reference` and the audit's defaults, so a later
`credo audit --task arith-long --n N --k-ref K` reuses it from the cache.

Usage: python bench/calibrate_arith_long.py [--task arith-long] [--checkpoint DIR] [--n 256] [--k-ref 32]
       [--eval-n 500] [--out docs/results/arith-long-calibration]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

import torch

from credo.lab.audit.config import AuditConfig
from credo.lab.audit.reference import build_reference
from credo.lab.audit.report import first_error_top1, labelled_errors, split_half_differences, split_half_spearman
from credo.train.evaluate import complete
from credo.policy import bind_task, load_policy
from credo.core.protocols import SamplingConfig
from credo.train.sft import ensure_sft
from credo.tasks import make_task

LOCALISABLE_DROP = 0.15


def first_error_histogram(task, problems, texts) -> tuple[Counter, int]:
    """Counter of first-error step positions (1-based) over wrong traces, and the number of wrong traces."""
    counts: Counter = Counter()
    wrong = 0
    for problem, text in zip(problems, texts):
        if task.is_correct(problem, text):
            continue
        wrong += 1
        first = task.step_truth(problem, text).first_error
        if first is not None:
            counts[first + 1] += 1
    return counts, wrong


def reference_sharpness(data, first_errors) -> dict:
    """Localisable share, the reference's own first-error top-1, and its two halves' agreement on it."""
    values = data.reference.values
    labelled = [(i, f) for i, f in enumerate(first_errors) if f is not None and f < len(values[i]) - 1]
    drops = [float(values[i][f] - values[i][f + 1]) for i, f in labelled]
    halves = split_half_differences(data.reference)
    return {
        "labelled_wrong_traces": len(labelled),
        "localisable_share": sum(d >= LOCALISABLE_DROP for d in drops) / max(len(drops), 1),
        "mean_drop_at_error": sum(drops) / max(len(drops), 1),
        "reference_first_error_top1": first_error_top1(data.reference.differences(), first_errors),
        "half_a_first_error_top1": first_error_top1([h[0] for h in halves], first_errors),
        "half_b_first_error_top1": first_error_top1([h[1] for h in halves], first_errors),
        "split_half_spearman": split_half_spearman(data.reference),
    }


def shares(counts: Counter) -> dict[str, float]:
    total = max(sum(counts.values()), 1)
    return {str(k): counts[k] / total for k in sorted(counts)}


def plot(histograms: dict[str, dict[str, float]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.4))
    width = 0.4
    for j, (label, hist) in enumerate(histograms.items()):
        xs = [int(k) + (j - 0.5) * width for k in hist]
        ax.bar(xs, list(hist.values()), width=width, label=label)
    ax.axhline(0.25, color="k", ls="--", lw=0.8, label="goal: no position > 25%")
    ax.set_xlabel("step of the labelled first error")
    ax.set_ylabel("share of wrong traces")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict, command: str) -> str:
    """calibration.md: the measured figures against the goals, and the histogram of first errors."""
    r = result
    lines = [f"# Calibration of `{r['task']}` on its SFT start", "", f"`{command}`", "",
             f"start `{r['checkpoint']}`: SFT {r['sft_minutes']:.1f} min ({r['sft_step']} steps, validation greedy "
             f"{r['sft_val_accuracy']}); reference: {r['n']} sampled traces (T={r['temperature']}, groups of 8), "
             f"K_ref={r['k_ref']}, {r['mean_segments_per_trace']:.1f} segments per trace, "
             f"{r['reference_generated_tokens_per_trace']:.0f} tokens generated per trace.", "",
             "| figure | measured | goal | met |", "|---|---|---|---|",
             f"| held-out greedy accuracy (n={r['eval_n']}) | {r['heldout_greedy_accuracy']:.3f} | 0.25-0.45 | "
             f"{r['goals']['greedy accuracy in [0.25, 0.45]']} |",
             f"| sampled accuracy (T={r['temperature']}) | {r['sampled_accuracy']:.3f} | | |",
             f"| largest first-error position share (sampled, {r['sampled_wrong']} wrong) | "
             f"{max(r['sampled_first_error_shares'].values(), default=float('nan')):.3f} | <= 0.25 | "
             f"{r['goals']['no first-error position > 25% (sampled)']} |",
             f"| largest first-error position share (greedy, {r['greedy_wrong']} wrong) | "
             f"{max(r['greedy_first_error_shares'].values(), default=float('nan')):.3f} | | |",
             f"| reference split-half Spearman, all segments | {r['split_half_spearman']:.3f} | >= 0.85 | "
             f"{r['goals']['split-half Spearman >= 0.85']} |",
             f"| localisable share (drop >= {LOCALISABLE_DROP} at the error; {r['labelled_wrong_traces']} labelled) | "
             f"{r['localisable_share']:.3f} | >= 0.60 | {r['goals']['localisable share >= 0.60']} |",
             f"| mean MC value drop at the labelled error | {r['mean_drop_at_error']:.3f} | | |",
             f"| reference first-error top-1 (K={r['k_ref']}; halves K={r['k_ref'] // 2}: "
             f"{r['half_a_first_error_top1']:.3f} / {r['half_b_first_error_top1']:.3f}) | "
             f"{r['reference_first_error_top1']:.3f} | | |", "",
             "First-error step (1-based) -> share of wrong traces with a labelled first error:", "",
             "| step | " + " | ".join(r["sampled_first_error_shares"]) + " |",
             "|---|" + "---|" * len(r["sampled_first_error_shares"]),
             "| sampled | " + " | ".join(f"{v:.3f}" for v in r["sampled_first_error_shares"].values()) + " |",
             "", "![first errors](first_errors.png)", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="arith-long")
    parser.add_argument("--checkpoint", help="policy directory (default: the task's SFT start)")
    parser.add_argument("--n", type=int, default=256, help="sampled traces for the reference (audit --n)")
    parser.add_argument("--k-ref", type=int, default=32)
    parser.add_argument("--eval-n", type=int, default=500, help="held-out problems for greedy accuracy")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature of the audited traces and of the reference continuations")
    parser.add_argument("--out", default="docs/results/arith-long-calibration")
    args = parser.parse_args()
    started = time.time()
    checkpoint = args.checkpoint or ensure_sft(task=args.task)
    task = make_task(args.task)
    policy = bind_task(load_policy(checkpoint), task)
    policy.model.eval()
    config = AuditConfig(checkpoint=checkpoint, task=args.task, n=args.n, k_ref=args.k_ref,
                         temperature=args.temperature)
    problems = task.heldout_problems(args.eval_n)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=config.max_new_tokens)
    texts, _ = complete(policy, problems, greedy, torch.Generator().manual_seed(0))
    greedy_accuracy = sum(task.is_correct(p, t) for p, t in zip(problems, texts)) / len(problems)
    greedy_hist, greedy_wrong = first_error_histogram(task, problems, texts)
    print(f"greedy accuracy {greedy_accuracy:.3f} (n={len(problems)}); building the reference ...", flush=True)
    data = build_reference(config, checkpoint, progress=True)
    rollouts = data.rollouts
    sampled_hist, sampled_wrong = first_error_histogram(task, rollouts.problems, rollouts.completions)
    first_errors = labelled_errors(task, rollouts)[0]
    summary_path = os.path.join(checkpoint, "sft_summary.json")
    sft = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    sharp = reference_sharpness(data, first_errors)
    result = {
        "task": args.task, "temperature": args.temperature, "task_config": vars(task.config), "checkpoint": checkpoint,
        "n": args.n, "k_ref": args.k_ref,
        "sft_minutes": sft.get("seconds", float("nan")) / 60, "sft_step": sft.get("step"),
        "sft_val_accuracy": sft.get("val_accuracy"),
        "heldout_greedy_accuracy": greedy_accuracy, "eval_n": len(problems),
        "sampled_accuracy": float(rollouts.correct.float().mean()),
        "greedy_first_error_shares": shares(greedy_hist), "greedy_wrong": greedy_wrong,
        "sampled_first_error_shares": shares(sampled_hist), "sampled_wrong": sampled_wrong,
        "mean_segments_per_trace": sum(len(v) - 1 for v in data.reference.values) / len(data.reference.values),
        "reference_generated_tokens_per_trace": data.reference_cost["tokens_generated_per_trace"],
        **sharp, "seconds": time.time() - started,
    }
    result["goals"] = {
        "greedy accuracy in [0.25, 0.45]": 0.25 <= greedy_accuracy <= 0.45,
        "no first-error position > 25% (sampled)": max(result["sampled_first_error_shares"].values(),
                                                       default=1) <= 0.25,
        "split-half Spearman >= 0.85": sharp["split_half_spearman"] >= 0.85,
        "localisable share >= 0.60": sharp["localisable_share"] >= 0.60,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "calibration.json"), "w") as f:
        json.dump(result, f, indent=2)
    command = "python bench/calibrate_arith_long.py " + " ".join(sys.argv[1:])
    with open(os.path.join(args.out, "calibration.md"), "w") as f:
        f.write(markdown(result, command.strip()))
    plot({f"sampled (T={args.temperature})": result["sampled_first_error_shares"],
          "greedy": result["greedy_first_error_shares"]},
         os.path.join(args.out, "first_errors.png"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
