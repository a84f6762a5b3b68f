"""RREDCoT probe cost: tokens scored and seconds, with and without prefix reuse, as trace length
(128..1024 tokens) and segment count (4..64) grow. Ratios are taken in one run.

Usage: python bench/rredcot_cost.py [--traces 8]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

from credo.credit.rredcot import RREDCoTConfig, probe_values  # noqa: E402
from credo.core.protocols import Problem, SamplingConfig, rewards_for  # noqa: E402
from credo.policy.gpt import GPTConfig  # noqa: E402
from credo.policy.tiny import TinyPolicy  # noqa: E402
from credo.core.probe import Probe  # noqa: E402
from credo.core.rollouts import Rollouts  # noqa: E402
from credo.train.sft import make_tokenizer  # noqa: E402
from credo.tasks.arith import ArithTask  # noqa: E402


def traces(policy: TinyPolicy, task: ArithTask, n: int, length: int, rng: random.Random) -> Rollouts:
    problem = Problem("12+30", "12+30\n", "42", {"terms": [12, 30], "ops": ["+"]})
    texts = []
    for i in range(n):
        answer = "#### " + ("42" if i % 2 == 0 else str(40 + i))
        body = "".join(rng.choice("0123456789+-=") for _ in range(length - len(answer) - 2))
        texts.append(body + "\n" + answer)
    p_ids, p_mask = policy.encode_prompts([problem.prompt] * n)
    ids, mask = policy.encode_completions(texts)
    rewards, correct = rewards_for(task, [problem] * n, texts)
    return Rollouts(p_ids, p_mask, ids, mask, torch.zeros(n, dtype=torch.long), rewards, torch.zeros(ids.shape),
                    correct, [problem] * n, texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tok = make_tokenizer()
    policy = TinyPolicy.create(GPTConfig(vocab_size=tok.vocab_size, max_len=1100), tok)
    policy.model.eval()
    task = ArithTask()
    rows = []
    for length in (128, 256, 512, 1024):
        for segments in (4, 16, 64):
            r = traces(policy, task, args.traces, length, random.Random(0))
            seg = {"name": "fixed", "n": max(length // segments, 1)}
            result = {}
            for reuse in (True, False):
                probe = Probe(policy, task, SamplingConfig(), torch.Generator().manual_seed(0))
                seg_ids = probe.segment(r, seg)
                start = time.perf_counter()
                with probe.metered() as spent:
                    probe_values(r, probe, seg_ids,
                                 RREDCoTConfig(candidates="answers", segmenter=seg, reuse_prefix=reuse))
                result[reuse] = (spent.tokens_scored / args.traces, time.perf_counter() - start)
            rows.append({"trace_tokens": length, "segments": segments,
                         "scored_per_trace_reuse": result[True][0], "scored_per_trace_no_reuse": result[False][0],
                         "tokens_ratio": result[False][0] / result[True][0],
                         "seconds_reuse": result[True][1], "seconds_no_reuse": result[False][1],
                         "speedup": result[False][1] / result[True][1]})
            print(rows[-1], flush=True)
    write("rredcot_cost", rows, "Candidates per trace: 2 (the group's two distinct answers incl. gold), template '?'. "
          "Reuse: one pass over the trace + |T+a| per (boundary, candidate); "
          "no reuse: every probe re-reads its prefix.")


if __name__ == "__main__":
    main()
