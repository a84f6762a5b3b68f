"""Cost of the training run's credit log (credo.train.credit_log) on a 64 x 512 batch (bench/credit_checks.py's:
8 prompts x 8 completions, lengths 64..512), GRPO credit, 1 CPU thread: the parts of the step's credit (computed
on a logging step, and on every step when the run reports to a tracker) and one credit file of 4 rows (every
credit_log_every steps). Best of `--repeats`.

Usage: python bench/credit_log.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write  # noqa: E402
from credit_checks import batch  # noqa: E402

from credo import credit as credit_registry  # noqa: E402
from credo.train.credit_log import components, tracker_metrics, write_step  # noqa: E402


def best(fn, repeats: int) -> tuple[float, object]:
    out, fastest = None, float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        fastest = min(fastest, time.perf_counter() - start)
    return fastest, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    r, _ = batch(300, 1)
    credit = credit_registry.get("grpo")(r)
    clipped = torch.zeros(r.completion_mask.shape, dtype=torch.bool)
    folder = tempfile.mkdtemp(prefix="credo-credit-log-")
    t_parts, parts = best(lambda: components(r, credit, clipped), args.repeats)
    t_metrics, _ = best(lambda: tracker_metrics(parts), args.repeats)
    t_file, path = best(lambda: write_step(folder, 10, "grpo", r, parts, 4, lambda ids: [str(i) for i in ids]),
                        args.repeats)
    size = os.path.getsize(path)
    os.remove(path)
    os.rmdir(os.path.dirname(path))
    os.rmdir(folder)
    write("credit_log", [{"what": "parts of the step's credit (64 x 512)", "ms": 1e3 * t_parts},
                         {"what": "the trackers' 5 scalars from them", "ms": 1e3 * t_metrics},
                         {"what": f"one credit file, 4 rows ({size:,} bytes)", "ms": 1e3 * t_file}],
          notes=f"best of {args.repeats}, 1 CPU thread; a credo train step on the CPU takes seconds to minutes.")


if __name__ == "__main__":
    main()
