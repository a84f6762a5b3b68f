"""Wall time of one training step per method, as ratios to GRPO, measured in the same run on the
same batches (same seed), on the task's SFT start. Goals (on arith-long): rredcot <= 1.5x,
sc_grpo <= 1.3x, ibpo alignment <= 1.05x.

Usage: python bench/overhead.py [--task arith] [--steps 6] [--rounds 2] [--threads 2]
       [--methods grpo,sc_grpo,ibpo,ibpo_correct,rredcot]
Results: bench/results/overhead.md (arith) or overhead_<task>.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

from credo.policy import load_policy  # noqa: E402
from credo.train.sft import ensure_sft  # noqa: E402
from credo.train.plan import load_train_config  # noqa: E402
from credo.train.trainer import Trainer  # noqa: E402

VARIANTS = {"ibpo_correct": ("ibpo", ["credit.mode=correct"])}


def step_seconds(name: str, steps: int, start: str, task: str) -> float:
    method, extra = VARIANTS.get(name, (name, []))
    config = load_train_config(None, [f"method={method}", f"start={start}", f"task={task}", *extra])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(config, tmp, policy=load_policy(start), progress=False)
        trainer.train_step()  # warm-up
        begin = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        return (time.perf_counter() - begin) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--methods", default="grpo,sc_grpo,ibpo,ibpo_correct,rredcot")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best per method is kept")
    parser.add_argument("--task", default="arith", help="arith | arith-long (the start is the task's SFT start)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = ensure_sft(task=args.task)
    names = args.methods.split(",")
    best = {n: float("inf") for n in names}
    for _ in range(args.rounds):  # interleave so machine noise hits every method alike
        for n in names:
            best[n] = min(best[n], step_seconds(n, args.steps, start, args.task))
    rows = [{"method": n, "seconds_per_step": best[n], "ratio_to_grpo": best[n] / best["grpo"]} for n in names]
    c = load_train_config(None, [])
    name = "overhead" if args.task == "arith" else f"overhead_{args.task}"
    write(name, rows, f"Task {args.task}, {args.threads} threads. Default TrainConfig ({c.prompts_per_step} prompts "
          f"x {c.group_size} samples, {c.epochs} "
          f"epoch(s) x {c.minibatches} mini-batch(es)); {args.steps} steps per method, best of {args.rounds} "
          f"interleaved rounds. Command: python bench/overhead.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
