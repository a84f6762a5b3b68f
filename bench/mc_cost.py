"""Cost of the Monte Carlo reference: tokens generated and seconds per trace as K (continuations per
boundary) and trace length (terms per problem) grow, on the shipped SFT start.

Usage: python bench/mc_cost.py [--traces 32]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

from credo.core.values import mc_values  # noqa: E402
from credo.policy import load_policy  # noqa: E402
from credo.core.protocols import SamplingConfig  # noqa: E402
from credo.core.probe import Probe  # noqa: E402
from credo.train.sft import ensure_sft  # noqa: E402
from credo.strategies import sample_groups  # noqa: E402
from credo.tasks.arith import ArithConfig, ArithTask  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(2)
    policy = load_policy(ensure_sft())
    policy.model.eval()
    sampling = SamplingConfig(max_new_tokens=96)
    rows = []
    for terms in (3, 5):
        task = ArithTask(ArithConfig(min_terms=terms, max_terms=terms))
        r = sample_groups(policy, task, task.heldout_problems(args.traces // 4), 4, sampling,
                          torch.Generator().manual_seed(0))
        length = float(r.completion_mask.sum(1).float().mean())
        for k in (4, 8, 16, 32):
            probe = Probe(policy, task, sampling, torch.Generator().manual_seed(1))
            seg = probe.segment(r, "lines")
            start = time.perf_counter()
            with probe.metered() as spent:
                mc_values(probe, r, seg, k)
            seconds = time.perf_counter() - start
            rows.append({"terms": terms, "trace_tokens": length, "k": k,
                         "generated_per_trace": spent.tokens_generated / r.batch_size,
                         "generated_vs_trace": spent.tokens_generated / r.batch_size / length,
                         "seconds_per_trace": seconds / r.batch_size})
            print(rows[-1], flush=True)
    write("mc_cost", rows, "generated_vs_trace: MC continuation tokens per trace over the trace's own length.")


if __name__ == "__main__":
    main()
