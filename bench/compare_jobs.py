"""Wall time of a small comparison grid run as one job (all cores to one training) versus --jobs N
(N one-process trainings, cpu_count/N threads each), measured in one run. Prints the speed-up.

Usage: python bench/compare_jobs.py [--jobs 2] [--tokens 30000] [--seeds 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

from credo.lab.compare import run as cmp  # noqa: E402
from credo.train.sft import ensure_sft  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=30_000, help="generated tokens per training run")
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    cmp.PRESETS["bench"] = cmp.Preset(methods=("grpo", "rloo"), seeds=tuple(range(args.seeds)),
                                      token_budget=args.tokens, eval_every_tokens=args.tokens, eval_n=50,
                                      final_eval_n=50, audit_n=0)
    start = ensure_sft(progress=False)
    rows = []
    for jobs in (1, args.jobs):
        with tempfile.TemporaryDirectory() as out:
            began = time.perf_counter()
            results = cmp.compare("bench", out, start=start, progress=False, jobs=jobs)
            seconds = time.perf_counter() - began
        assert not results["failures"], results["failures"]
        rows.append({"jobs": jobs, "runs": 2 * args.seeds, "tokens_per_run": args.tokens, "seconds": round(seconds, 1)})
    for row in rows:
        row["speedup_vs_1_job"] = round(rows[0]["seconds"] / row["seconds"], 2)
    write("compare_jobs", rows, notes="`credo compare --jobs N` against one job, same grid, same machine, one run")


if __name__ == "__main__":
    main()
