"""Cost of the masked-perturbation invariance check (credo.integrations.leak_check) on a 64 x 512 batch: 8 prompts
x 8 completions, 512 response tokens (lengths uniform in 64..512, so about half the positions are padding), 128
prompt tokens, 0/1 rewards, on the CPU, 1 thread.

For each estimator: one estimator call, and the check as the adapters run it (given the run's credit: it
refills the padding of completion ids, old log-probs and segment ids, reruns the estimator once and compares).
The ratio is check / one estimator call: about 1 plus the refill and compare, whatever the estimator. Estimators:
grpo (rewards only, the cheapest call, so the refill's share is largest there), rredcot with the
cheapest model (a tiny random Llama, 2 layers, width 32: its probe scores the batch), entropy_mask (one scoring
pass of the same model). Best of `--repeats` after one warm-up, calls alternating.

Usage: python bench/leak_check.py [--repeats 5] [--estimators grpo,entropy_mask,rredcot]  (about 5 minutes with
rredcot on a 2-core machine, seconds without)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from common import write  # noqa: E402
from credit_checks import GROUP, P, PROMPTS, R, batch, interleaved  # noqa: E402

from credo import credit as credit_registry  # noqa: E402
from credo.core.probe import Probe  # noqa: E402
from credo.core.segment import segmentation_stage  # noqa: E402
from credo.integrations.checks import Where  # noqa: E402
from credo.integrations.leak_check import check_estimator_invariance, folded  # noqa: E402
from credo.core.protocols import SamplingConfig  # noqa: E402
from credo.tasks import make_task  # noqa: E402

ESTIMATORS = ("grpo", "entropy_mask", "rredcot")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from builders import build_tokenizer, tiny_llama
    from credo.policy import bind_task
    from credo.policy.hf import HFPolicy
    tokenizer = build_tokenizer()
    task = make_task("gym:chain_sum")
    policy = bind_task(HFPolicy(tiny_llama(tokenizer, max_positions=P + R).eval(), tokenizer), task)
    r, _ = batch(len(tokenizer), tokenizer.pad_token_id)
    where = Where(step=0, off="-")
    rows = []
    for name in args.estimators.split(","):
        spec = credit_registry.get(name)
        config = spec.make_config()
        probe = Probe(policy, task, SamplingConfig(max_new_tokens=8), torch.Generator().manual_seed(0))
        rollouts, _ = segmentation_stage(r, probe, spec.reads_batch_segments(config))
        state = probe.generator.get_state()
        before = folded(spec(rollouts, probe, config))

        def call() -> None:
            probe.generator.set_state(state)
            spec(rollouts, probe, config)

        def check() -> None:
            check_estimator_invariance(spec, rollouts, probe, config, where, before=before, generator_state=state,
                                       vocab_size=len(tokenizer))

        t = interleaved({"call": call, "check": check}, args.repeats)
        rows.append({"estimator": name, "estimator call ms": 1e3 * t["call"], "check ms": 1e3 * t["check"],
                     "check / call": f"{t['check'] / t['call']:.2f}x"})
        print(rows[-1], flush=True)
    write("leak_check", rows, notes=f"batch {PROMPTS * GROUP} x {R} (prompts {P}, {int((~r.completion_mask).sum())} "
                                    f"padding positions), best of {args.repeats}, 1 CPU thread, "
                                    f"{time.strftime('%H:%M')}; the machine is shared, small differences are noise.")


if __name__ == "__main__":
    main()
