"""Tokens/s and credo's credit overhead from verl's file-logger metrics (one baseline run, one credo run).

    python examples/gpu/verl_summary.py runs/verl-grpo/metrics.jsonl runs/verl-rredcot/metrics.jsonl
    python examples/gpu/verl_summary.py --dry-run     # CPU: credit_on_shards + the worker mixin on a tiny model

Per run, over steps after the first (warm-up): perf/throughput (tokens/s per GPU, verl's own), seconds
per step (timing_s/step) and the advantage step's share (timing_s/adv: credo's credit for credo:<name>);
then the step-time ratio credo/baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def summarise(path: str) -> dict[str, float]:
    rows = [json.loads(line)["data"] for line in open(path) if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r][1:] or rows
    if not rows:
        raise SystemExit(f"{path}: no training steps logged")

    def mean(key: str) -> float:
        values = [float(r[key]) for r in rows if key in r]
        return sum(values) / len(values) if values else float("nan")
    return {"tokens_per_s_per_gpu": mean("perf/throughput"), "seconds_per_step": mean("timing_s/step"),
            "adv_seconds": mean("timing_s/adv")}


def dry_run() -> None:
    """The worker-side path on CPU: a tiny random Llama, a 16-row DataProto, 2 shards, rredcot."""
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    import conftest
    import test_verl as tv
    from credo.integrations.verl_credit import credit_on_shards
    policy, task, r = conftest.hf_setup.__wrapped__()
    batch = tv.to_dataproto(r, task, torch.arange(r.batch_size))
    started = time.perf_counter()
    out = credit_on_shards(batch, {"estimator": "rredcot"}, tv.dispatch(policy, task, 2), 2)
    seconds = time.perf_counter() - started
    tokens = int(batch.batch["attention_mask"].sum())
    print(f"dry run: rredcot credit on {len(batch)} rows / 2 shards in {seconds:.2f} s "
          f"({tokens / seconds:.0f} batch tokens/s, {out.meta_info['credo_tokens_scored']:.0f} tokens scored)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="baseline metrics.jsonl, then the credo run's metrics.jsonl")
    parser.add_argument("--dry-run", action="store_true", help="run the credit path on CPU with a tiny model")
    args = parser.parse_args()
    if args.dry_run:
        dry_run()
        return
    if len(args.runs) != 2:
        parser.error("give two metrics.jsonl files: the baseline run's, then the credo run's")
    base, ours = (summarise(p) for p in args.runs)
    for name, s in (("baseline", base), ("credo", ours)):
        print(f"{name:9s} {s['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, {s['seconds_per_step']:.2f} s/step, "
              f"advantage step {s['adv_seconds']:.2f} s")
    print(f"credit overhead: step time x{ours['seconds_per_step'] / base['seconds_per_step']:.2f} vs baseline; "
          f"credit = {ours['adv_seconds'] / ours['seconds_per_step']:.1%} of the credo step")


if __name__ == "__main__":
    main()
