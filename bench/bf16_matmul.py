"""Whether `dtype=bfloat16-mixed` pays on this CPU, in one run: a linear layer of SmolLM2-135M's MLP shape
(576 -> 1536, a batch of 2,400 token rows: 8 completions of ~300 tokens) forward and backward, in float32 and under
bfloat16 autocast, timed alternately (median of --repeats each), and whether the CPU has bfloat16 matrix units.
Without them (an AVX2-only CPU) torch's bfloat16 products take a slow fallback kernel.

Usage: python bench/bf16_matmul.py [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

from credo.policy.device import cpu_has_bfloat16_units  # noqa: E402

ROWS, D_IN, D_OUT = 2400, 576, 1536


def step_seconds(layer: torch.nn.Linear, x: torch.Tensor, autocast: bool) -> float:
    """Seconds of one forward and backward of `layer` on `x`, in float32 or under bfloat16 autocast."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x)
    y.float().square().mean().backward()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed steps of each dtype (default 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layer = torch.nn.Linear(D_IN, D_OUT)
    x = torch.randn(ROWS, D_IN, requires_grad=True)
    times: dict[str, list[float]] = {"float32": [], "bfloat16-mixed": []}
    for _ in range(args.repeats):  # alternated, so a change of machine load hits both
        times["float32"].append(step_seconds(layer, x, autocast=False))
        times["bfloat16-mixed"].append(step_seconds(layer, x, autocast=True))
    base = statistics.median(times["float32"])
    rows = [{"dtype": name, "seconds forward + backward": round(statistics.median(t), 4),
             "x float32": round(statistics.median(t) / base, 2)} for name, t in times.items()]
    units = {True: "yes", False: "no", None: "unknown"}[cpu_has_bfloat16_units()]
    capability = torch.backends.cpu.get_cpu_capability()
    write("bf16_matmul", rows, f"bfloat16 matrix units (AVX512-BF16, AMX or Arm BF16): {units}; "
                               f"torch threads: {torch.get_num_threads()}; capability {capability}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
