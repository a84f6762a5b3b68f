"""The 60-run long comparison (docs/results/compare-long-chain) re-costed at the current speed, from timed steps.

Its runs' own clocks (summary.json `seconds`, 25.3 h in all) were paid by the code before the speed work. Here training
steps of grpo and rredcot on the comparison's own configs (run *-s0's config.yaml) are timed with the reference
code (`--reference`, a commit extracted with git archive) and with this tree, alternately in one run (subprocesses,
same seed, so the same batches), and each run's clock is scaled:
  rredcot, shuffled_of=rredcot   x rredcot's measured step ratio (its branch scoring changed)
  vineppo                        x the batch-1024 sampling ratio of bench/results/throughput.json (its step is
                                   Monte Carlo sampling at batch 1024)
  every other method             minus grpo's measured saving per step (its sampling; their own extra work is
                                   unchanged), in the comparison's seconds: steps x grpo's s/step there x (1 - ratio)

Usage: python bench/compare_cost.py [--steps 2] [--rounds 2] [--threads 2] [--reference f9587d4]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, "docs", "results", "compare-long-chain", "runs")
WORKER = """
import json, sys, tempfile, time, torch
from credo.train.sft import ensure_sft
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer
config_path, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
config = load_train_config(config_path, [f"start={ensure_sft(progress=False, task='arith-long')}"])
with tempfile.TemporaryDirectory() as tmp:
    trainer = Trainer(config, tmp, progress=False)
    trainer.train_step()  # warm-up
    began = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    print(json.dumps({"seconds_per_step": (time.perf_counter() - began) / steps}))
"""


def step_seconds(src: str, method: str, steps: int, threads: int) -> float:
    """Seconds per training step of run `method`-s0's config with the credo package under `src`."""
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", WORKER, os.path.join(RUNS, f"{method}-s0", "config.yaml"), str(steps),
                          str(threads)], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds_per_step"]


def old_clocks() -> dict[str, tuple[float, int]]:
    """Per method: (seconds, steps) summed over its runs' summary.json."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for path in glob.glob(os.path.join(RUNS, "*", "summary.json")):
        with open(path) as f:
            summary = json.load(f)
        method = os.path.basename(os.path.dirname(path)).rsplit("-s", 1)[0]
        out[method][0] += summary["seconds"]
        out[method][1] += summary["step"]
    return {m: (s, int(n)) for m, (s, n) in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference", default="f9587d4")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", ROOT, "archive", args.reference, "src"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        srcs = {"reference": os.path.join(tmp, "src"), "current": os.path.join(ROOT, "src")}
        best = {(m, arm): float("inf") for m in ("grpo", "rredcot") for arm in srcs}
        for _ in range(args.rounds):  # alternate, so machine load hits both arms alike
            for method in ("grpo", "rredcot"):
                for arm, src in srcs.items():
                    best[method, arm] = min(best[method, arm], step_seconds(src, method, args.steps, args.threads))
    ratio = {m: best[m, "current"] / best[m, "reference"] for m in ("grpo", "rredcot")}
    # read after the timing: a throughput run may rewrite it meanwhile
    with open(os.path.join(ROOT, "bench", "results", "throughput.json")) as f:
        sampling = {r["what"]: r["speedup_vs_f9587d4"] for r in json.load(f)["rows"]}
    speedup_1024 = sampling["sampling, batch 1024, current"]
    clocks = old_clocks()
    grpo_old_step = clocks["grpo"][0] / clocks["grpo"][1]
    rows = []
    for method, (seconds, steps) in sorted(clocks.items()):
        if method in ("rredcot", "shuffled_of=rredcot"):
            new, how = seconds * ratio["rredcot"], "x rredcot's step ratio"
        elif method == "vineppo":
            new, how = seconds / speedup_1024, "/ batch-1024 sampling speed-up"
        else:
            new, how = seconds - steps * grpo_old_step * (1 - ratio["grpo"]), "- grpo's saving per step"
        rows.append({"method": method, "old_hours": seconds / 3600, "new_hours": new / 3600, "how": how})
    old_total, new_total = sum(r["old_hours"] for r in rows), sum(r["new_hours"] for r in rows)
    rows.append({"method": "all 60 runs", "old_hours": old_total, "new_hours": new_total, "how": ""})
    write("compare_cost", rows, f"Measured step ratios current/{args.reference} (best of {args.rounds} alternating "
          f"rounds, {args.steps} steps after a warm-up, {args.threads} threads): grpo {ratio['grpo']:.3f}, rredcot "
          f"{ratio['rredcot']:.3f} (seconds: {json.dumps({f'{m}/{a}': round(v, 2) for (m, a), v in best.items()})}); "
          f"batch-1024 sampling speed-up {speedup_1024:.2f}x. The comparison would cost {new_total:.1f} h instead of "
          f"{old_total:.1f} h ({new_total / old_total:.2f}x). Command: python bench/compare_cost.py "
          f"{' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
