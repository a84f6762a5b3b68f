"""RREDCoT's branch scoring on a real arith-long step: the current packing (credo.policy.branches) against
f9587d4's (bench/reference_f9587d4.py), timed alternately in one run on the same branches, with the largest
difference of their log-probs. The branches are those RREDCoT scores on the first step of a default run (seed 0).

Usage: python bench/branch_scoring.py [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402
from reference_f9587d4 import reference_score_branches  # noqa: E402

import credo.policy.tiny as tiny  # noqa: E402
from credo.policy import load_policy  # noqa: E402
from credo.train.sft import ensure_sft  # noqa: E402
from credo.train.plan import load_train_config  # noqa: E402
from credo.train.trainer import Trainer  # noqa: E402


def captured_calls(start: str) -> list[tuple]:
    """The (prompt_ids, prompt_mask, completion_ids, completion_mask, branches) of every scoring call of one step."""
    calls = []
    original = tiny.TinyPolicy.score_branches

    def capture(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        calls.append(args[:5])
        return original(self, *args, **kwargs)

    tiny.TinyPolicy.score_branches = capture
    try:
        config = load_train_config(None, ["method=rredcot", f"start={start}", "task=arith-long"])
        with tempfile.TemporaryDirectory() as tmp:
            Trainer(config, tmp, policy=load_policy(start), progress=False).train_step()
    finally:
        tiny.TinyPolicy.score_branches = original
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = ensure_sft(task="arith-long")
    calls = captured_calls(start)
    policy = load_policy(start)
    model = policy.model.eval()
    paths = {"f9587d4": lambda c: reference_score_branches(model, *c, policy.pad_id),
             "current": lambda c: policy.score_branches(*c, True)[0]}
    diff = max(float((a - b).abs().max()) for c in calls for a, b in zip(paths["f9587d4"](c), paths["current"](c)))
    best = {name: float("inf") for name in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            began = time.perf_counter()
            for c in calls:
                fn(c)
            best[name] = min(best[name], time.perf_counter() - began)
    n = sum(len(c[4]) for c in calls)
    rows = [{"path": name, "seconds_per_step": best[name], "speedup": best["f9587d4"] / best[name]} for name in paths]
    write("branch_scoring", rows, f"{len(calls)} calls, {n} branches of one arith-long rredcot step; best of "
          f"{args.rounds} alternating rounds, {args.threads} threads; largest |log-prob difference| {diff:.2g} "
          "(floating-point order). "
          f"Command: python bench/branch_scoring.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
