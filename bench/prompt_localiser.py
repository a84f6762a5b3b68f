"""SRPO's prompt localiser on a real instruction model: how often its reply parses, by reply budget.

SmolLM2-135M-Instruct (offline, `--start smollm2-135m`) samples completions of `gym:chain_sum`
problems; failed ones with >= 2 steps (keyword_entropy segments) are the parents. Each parent is
sent the public SRPO localisation request (bare user turn, temperature 0.3) at every reply budget,
and the rule that decided the step is counted: a boxed step number, a "Step N" in the prose, or the
step-1 fallback (empty, truncated or number-free replies). Also: the share of replies cut by the
budget (no EOS) and the share of picks at step 1. The tiny arith policy cannot be measured: it
cannot read the request.

Usage: python bench/prompt_localiser.py [--parents 16] [--budgets 64,256,1024]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

from credo.policy import bind_task, load_policy  # noqa: E402
from credo.core.protocols import SamplingConfig  # noqa: E402
from credo.core.probe import Probe  # noqa: E402
from credo.strategies.localisers import localisation_replies, parse_step  # noqa: E402
from credo.core.segment import segment_bounds  # noqa: E402
from credo.strategies import sample_groups  # noqa: E402
from credo.tasks import make_task  # noqa: E402


def find_parents(policy, task, wanted: int, sampling: SamplingConfig):  # noqa: ANN001
    """Failed completions with at least two steps, and their segment ids."""
    g = torch.Generator().manual_seed(0)
    problems = task.train_problems(wanted * 2, torch.Generator().manual_seed(1))  # ~half of them fail
    r = sample_groups(policy, task, problems, 1, sampling, g)
    probe = Probe(policy, task, sampling, torch.Generator().manual_seed(2))
    seg = probe.segment(r, "keyword_entropy")
    rows = [i for i, b in enumerate(segment_bounds(seg)) if len(b) >= 2 and not bool(r.correct[i])][:wanted]
    return r, seg, rows, probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parents", type=int, default=16)
    parser.add_argument("--budgets", default="64,256,1024")
    args = parser.parse_args()
    torch.set_num_threads(2)
    task = make_task("gym:chain_sum", {"min_terms": 4, "max_terms": 6})
    policy = bind_task(load_policy("smollm2-135m"), task)
    policy.model.eval()
    r, seg, rows, probe = find_parents(policy, task, args.parents, SamplingConfig(1.0, 1.0, 256))
    n_steps = [len(b) for b in segment_bounds(seg[rows])]
    out = []
    for budget in [int(b) for b in args.budgets.split(",")]:
        start = time.perf_counter()
        with probe.metered() as spent:
            replies = localisation_replies(r, rows, probe, seg, 0.3, budget)
        generated = spent.tokens_generated
        parsed = [parse_step(reply, n) for reply, n in zip(replies, n_steps)]
        rules = [rule for _, rule in parsed]
        cut = sum(1 for reply in replies if len(policy.encode_continuation(reply)) >= budget)
        out.append({"budget": budget, "parents": len(rows), "boxed": rules.count("boxed") / len(rows),
                    "prose": rules.count("prose") / len(rows), "fallback": rules.count("fallback") / len(rows),
                    "cut_by_budget": cut / len(rows), "step1_share": sum(s == 0 for s, _ in parsed) / len(rows),
                    "reply_tokens": generated / len(rows), "seconds": round(time.perf_counter() - start, 1)})
        if budget == max(int(b) for b in args.budgets.split(",")):
            random.Random(0).shuffle(replies)
            print("sample replies:", *[repr(x[-300:]) for x in replies[:3]], sep="\n")
    write("prompt_localiser", out, notes="SmolLM2-135M-Instruct, gym:chain_sum 4-6 terms, parents = failed traces "
          "with >= 2 keyword_entropy steps; rule shares sum to 1 (boxed + prose = parse success).")


if __name__ == "__main__":
    main()
