"""`dtype=bfloat16-mixed` against float32 for a Hugging Face start on this machine, in one run: the seconds of a
GRPO step of each (timed alternately, so machine load hits both alike), and how far the mixed-precision numbers
are from float32's: per-token log-probabilities and the next-token KL on the same completions, and greedy
held-out completions and accuracy.

Mixed precision keeps the weights, gradients and AdamW state in float32 and runs the matrix products in
bfloat16 under torch.autocast; its speed-up needs bfloat16 matrix units (a CPU with AMX or AVX512-BF16, or a GPU).

Usage: python bench/mixed_precision.py --start DIR [--steps 3] [--heldout 32] [--threads N]
(DIR: a credo SmolLM2 start, e.g. runs/smol-sft-long-skilled from examples/smollm2/sft-long-skilled.yaml;
default smollm2-135m, the shipped instruct model)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

from credo.train.plan import load_train_config  # noqa: E402
from credo.train.trainer import Trainer  # noqa: E402

TASK = ["task=gym:chain_sum", "task_options.min_terms=5", "task_options.max_terms=8", "task_options.min_digits=1",
        "task_options.max_digits=1"]  # smollm2-long's task
DTYPES = ("float32", "bfloat16-mixed")


def trainer(start: str, dtype: str, out: str) -> Trainer:
    """A GRPO trainer on smollm2-long's schedule (2 prompts x 4 completions, <= 64 tokens, one AdamW step)."""
    config = load_train_config(None, [f"start={start}", *TASK, "prompts_per_step=2", "group_size=4",
                                      "sampling.max_new_tokens=64", "lr=2e-6", "epochs=1", "minibatches=1",
                                      "eval_n=1", "final_eval_n=0", f"dtype={dtype}", "device=cpu"])
    return Trainer(config, out, progress=False)


def step_seconds(trainers: dict[str, Trainer], steps: int) -> dict[str, float]:
    """Median seconds of a training step per dtype, the dtypes alternating step by step (after a warm-up each).
    Both draw the same prompts from the same seed; their completions differ once a sampled token does."""
    for t in trainers.values():
        t.train_step()
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(steps):
        for name, t in trainers.items():
            began = time.perf_counter()
            t.train_step()
            times[name].append(time.perf_counter() - began)
    return {name: sorted(v)[len(v) // 2] for name, v in times.items()}


@torch.no_grad()
def agreement(full: Trainer, mixed: Trainer, heldout: int) -> dict[str, float]:
    """On float32's greedy completions of `heldout` held-out problems: mean and max |Δ log p| per completion
    token, the mean next-token KL(float32 || mixed), and the share of problems whose greedy completion is the
    same text, with each dtype's accuracy (the two policies hold the same float32 weights)."""
    from credo.core.protocols import SamplingConfig
    from credo.train.evaluate import evaluate
    mixed.policy.model.load_state_dict(full.policy.model.state_dict())
    task, problems = full.task, full.task.heldout_problems(heldout)
    ids, mask = full.policy.encode_prompts([p.prompt for p in problems])
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=64)
    sampled = full.policy.sample(ids, mask, greedy, torch.Generator().manual_seed(0))
    both = [p.completion_logits(ids, mask, sampled.completion_ids, sampled.completion_mask).log_softmax(-1)
            for p in (full.policy, mixed.policy)]
    keep = sampled.completion_mask.bool()
    chosen = [lp.gather(-1, sampled.completion_ids[..., None])[..., 0][keep] for lp in both]
    gap = (chosen[0] - chosen[1]).abs()
    kl = (both[0].exp() * (both[0] - both[1])).sum(-1)[keep]
    texts = [[p.decode(row[m.bool()]) for row, m in zip(s.completion_ids, s.completion_mask)]
             for p, s in ((full.policy, sampled),
                          (mixed.policy, mixed.policy.sample(ids, mask, greedy, torch.Generator().manual_seed(0))))]
    accuracy = {name: evaluate(t.policy, task, problems, max_new_tokens=64, progress=False).accuracy
                for name, t in (("float32", full), ("bfloat16-mixed", mixed))}
    return {"mean |Δ log p| per token": gap.mean().item(), "max |Δ log p|": gap.max().item(),
            "mean KL per token": kl.mean().item(),
            "same greedy completion": sum(a == b for a, b in zip(*texts)) / len(problems),
            "greedy accuracy float32": accuracy["float32"], "greedy accuracy mixed": accuracy["bfloat16-mixed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", default="smollm2-135m", help="a Hugging Face start (credo SFT dir or alias)")
    parser.add_argument("--steps", type=int, default=3, help="timed GRPO steps per dtype (median reported)")
    parser.add_argument("--heldout", type=int, default=32, help="held-out problems for the agreement checks")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {name: trainer(args.start, name, f"{tmp}/{name}") for name in DTYPES}
        seconds = step_seconds(trainers, args.steps)
        close = agreement(trainers["float32"], trainers["bfloat16-mixed"], args.heldout)
    rows = [{"dtype": name, "seconds per GRPO step": s, "× float32": seconds["float32"] / s}
            for name, s in seconds.items()]
    notes = "\n".join(f"- {k}: {v:.4g}" for k, v in close.items())
    write("mixed_precision", rows, f"start {args.start}, {args.threads} threads; on float32's greedy completions of "
          f"{args.heldout} held-out problems:\n{notes}")


if __name__ == "__main__":
    main()
