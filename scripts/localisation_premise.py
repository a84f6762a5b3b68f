"""SRPO's premise, measured the way SRPO uses it, on one or more Hugging Face starts on `gym:chain_sum` with step
labels (a `credo sft --start ...` output or its `--snapshots`): can the policy name the first wrong step of a
wrong trace?

Two measures per start, on problems of `--split` (validation: a fixed draw of training-split problems, apart from
the test set, for choosing; heldout: the test set, for the figure that is reported):

- own traces: the policy samples `--group-size` traces per problem; on its wrong traces with a labelled first
  error, the `prompt` localiser asks it, exactly as a reset does at training time (credo.strategies.localisers):
  parse rate, first-error top-1, the share of resets at each step beside where the first errors lie, top-1 by
  the first error's position and kind (credo.lab.audit.premises.measure_premises);
- synthetic traces: the SFT's own kind of example (credo.tasks.gym_skills.localisation_example: one line
  corrupted), asked the same way: top-1 and top-1 by kind, the curve's in-distribution end.

    python scripts/localisation_premise.py STEP_DIR [STEP_DIR ...] --out OUT.jsonl [--split heldout]

One JSON line per start is appended to OUT.jsonl (a start already measured with the same settings is skipped, so
a stopped run resumes). The start's task and options are read from its sft_config.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch
import yaml

from credo.core.protocols import SamplingConfig
from credo.lab.audit.premises import measure_premises
from credo.lab.audit.localisation import pick_figures
from credo.policy import bind_task, load_policy
from credo.strategies.localisers import parse_step
from credo.tasks import make_task
from credo.tasks.base import VALIDATION_SEED
from credo.tasks.gym import chain
from credo.tasks.gym_skills import corrupted_trace

REPLY_TEMPERATURE = 0.3  # the prompt localiser's (SRPO's public code)


def problems_of(task, split: str, n: int) -> list:  # noqa: ANN001
    if split == "heldout":
        return task.heldout_problems(n)
    # a fixed draw of the training split other than the SFT's validation checks' (it may hold problems the SFT
    # trained on: the split is the training one; the figure to report is --split heldout)
    return task.train_problems(n, torch.Generator().manual_seed(VALIDATION_SEED + 1))


def synthetic_figures(policy, task, problems: list, max_reply: int, seed: int) -> dict:  # noqa: ANN001
    """The prompt localiser's reply to the SFT's own kind of request (one line corrupted, at a uniform line, as
    credo.tasks.gym_skills.localisation_example builds it), one per problem, sampled as the localiser samples."""
    rng = random.Random(seed)
    requests, truths, slips, n_steps = [], [], [], []
    for problem in problems:
        n = len(chain(task.expression(problem))[1]) + 1  # the running-sum lines and the answer line
        trace = corrupted_trace(task, problem, rng.randrange(n), rng)
        truth = task.step_truth(problem, trace)
        requests.append(task.localisation_prompt(problem, trace.splitlines(keepends=True)))
        truths.append(truth.first_error)
        slips.append(truth.first_slip)
        n_steps.append(n)
    ids, mask = policy.encode_prompts(requests, system=False)
    with torch.no_grad():
        out = policy.sample(ids, mask, SamplingConfig(REPLY_TEMPERATURE, 1.0, max_reply),
                            torch.Generator().manual_seed(seed))
    replies = [policy.decode(c) for c in out.completion_ids]
    parsed = [parse_step(reply, n) for reply, n in zip(replies, n_steps)]
    picks = [k for k, _ in parsed]
    return {"traces": len(picks), "localisation_top1": sum(k == t for k, t in zip(picks, truths)) / len(picks),
            "random_top1_expectation": sum(1 / n for n in n_steps) / len(n_steps),
            "parse_rate": sum(rule != "fallback" for _, rule in parsed) / len(parsed),
            "mean_reply_chars": sum(map(len, replies)) / len(replies),
            **pick_figures(picks, truths, slips), "example": {"request": requests[0], "reply": replies[0]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("starts", nargs="+", help="start directories (each with its sft_config.yaml)")
    parser.add_argument("--out", required=True, help="JSON lines file to append to")
    parser.add_argument("--split", choices=("validation", "heldout"), default="validation")
    parser.add_argument("--problems", type=int, default=64, help="problems whose traces the policy samples")
    parser.add_argument("--group-size", type=int, default=4, help="traces per problem")
    parser.add_argument("--synthetic", type=int, default=64, help="synthetic wrong traces (0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="trace length limit")
    parser.add_argument("--max-reply", type=int, default=320, help="localisation reply limit (SRPO's is 4096)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = {k: getattr(args, k) for k in ("split", "problems", "group_size", "synthetic", "max_new_tokens",
                                              "max_reply", "seed")}
    done = []
    if os.path.exists(args.out):
        done = [(row["start"], row["settings"]) for row in map(json.loads, open(args.out))]
    for start in args.starts:
        if (os.path.abspath(start), settings) in done:
            continue
        config_path = os.path.join(start, "sft_config.yaml")
        config = yaml.safe_load(open(config_path)) if os.path.isfile(config_path) else None
        if not isinstance(config, dict) or not isinstance(config.get("task"), str) or \
                not (config.get("task_options") or {}).get("step_labels"):
            print(f"{config_path}: not a Hugging Face SFT start on a gym task with step_labels", file=sys.stderr)
            return 2
        task = make_task(config["task"], config.get("task_options") or {})
        policy = bind_task(load_policy(start), task)
        policy.model.eval()
        began = time.time()
        problems = problems_of(task, args.split, args.problems)
        sampling = SamplingConfig(1.0, 1.0, args.max_new_tokens)
        own = measure_premises(policy, task, problems, args.group_size, sampling, args.seed, False, ["prompt"],
                               prompt_max_new_tokens=args.max_reply)
        row = {"start": os.path.abspath(start), "settings": settings, **own}
        if args.synthetic:
            row["synthetic"] = synthetic_figures(policy, task, problems_of(task, args.split, args.synthetic),
                                                 args.max_reply, args.seed)
        row["seconds"] = round(time.time() - began, 1)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        done.append((row["start"], settings))
        loc, syn = own["localisers"]["prompt"], row.get("synthetic", {})
        print(f"{start}: accuracy {own['accuracy']:.3f}; own wrong traces {loc.get('traces', 0)}: parse "
              f"{loc.get('parse_rate', float('nan')):.2f}, top-1 {loc.get('localisation_top1', float('nan')):.3f} "
              f"(uniform {loc.get('random_top1_expectation', float('nan')):.3f}), by kind "
              f"{loc.get('top1_by_slip', {})}; synthetic top-1 {syn.get('localisation_top1', float('nan')):.3f} "
              f"({row['seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
