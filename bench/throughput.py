"""Tiny-policy throughput: sampling tokens/s of the code as it is and of f9587d4's loop (bench/reference_f9587d4.py),
at several batch sizes, and training tokens/s; the speed-ups are ratios taken in one run, the two sampling paths
timed alternately so machine load hits both alike.

Usage: python bench/throughput.py [--batches 64,1024] [--new-tokens 64] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402
from reference_f9587d4 import ReferenceKVCache, reference_forward, reference_generate  # noqa: E402

from credo.core.protocols import SamplingConfig  # noqa: E402
from credo.policy.base import generate  # noqa: E402
from credo.policy.gpt import GPTConfig  # noqa: E402
from credo.policy.tiny import TinyPolicy, cached_step  # noqa: E402
from credo.train.sft import make_tokenizer  # noqa: E402


def sampling_seconds(policy: TinyPolicy, batch: int, new_tokens: int, rounds: int) -> dict[str, float]:
    """Best wall time of one sampling call per path (after a warm-up call each), the paths alternating."""
    tok, model = policy.tokenizer, policy.model
    ids, mask = policy.encode_prompts(["37+48-12+55\n"] * batch)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens)
    no_eos = [tok.eos_id] + tok.banned_ids  # never stop early, so both paths make the same number of tokens
    width = ids.shape[1] + new_tokens

    def current() -> torch.Tensor:
        step = cached_step(model, model.new_cache(batch, width))
        return generate(step, ids, mask, sampling, torch.Generator().manual_seed(0), eos_id=-1, pad_id=0,
                        banned_ids=no_eos).logprobs

    def reference() -> torch.Tensor:
        cache = ReferenceKVCache(model, batch, width)
        return reference_generate(lambda x, m: reference_forward(model, x, m, cache)[:, -1], ids, mask, sampling,
                                  torch.Generator().manual_seed(0), eos_id=-1, pad_id=0, banned_ids=no_eos).logprobs

    paths = {"f9587d4": reference, "current": current}
    best = {name: float("inf") for name in paths}
    with torch.no_grad():
        if not torch.equal(current(), reference()):
            raise SystemExit("the current sampling path is not bit-identical to f9587d4's")
        for _ in range(rounds):
            for name, fn in paths.items():
                began = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - began)
    return best


def training_tokens_per_s(policy: TinyPolicy, rounds: int) -> float:
    seq = torch.randint(3, policy.tokenizer.vocab_size, (64, 80), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(policy.model.parameters(), lr=1e-4)
    policy.model.train()
    best = float("inf")
    for i in range(rounds + 1):  # the first is a warm-up
        began = time.perf_counter()
        logits = policy.model(seq)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i:
            best = min(best, time.perf_counter() - began)
    return seq.numel() / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="64,1024")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = make_tokenizer()
    policy = TinyPolicy.create(GPTConfig(vocab_size=tok.vocab_size), tok)
    policy.model.eval()
    rows, notes = [], []
    for batch in (int(b) for b in args.batches.split(",")):
        best = sampling_seconds(policy, batch, args.new_tokens, args.rounds)
        tokens = batch * args.new_tokens
        for name in ("f9587d4", "current"):
            rows.append({"what": f"sampling, batch {batch}, {name}", "tokens_per_s": tokens / best[name],
                         "speedup_vs_f9587d4": best["f9587d4"] / best[name]})
        notes.append(f"batch {batch}: {best['f9587d4'] / best['current']:.2f}x")
    rows.append({"what": "training fwd+bwd+AdamW (batch 64 x 80)",
                 "tokens_per_s": training_tokens_per_s(policy, args.rounds),
                 "speedup_vs_f9587d4": float("nan")})
    params = sum(p.numel() for p in policy.model.parameters()) / 1e6
    write("throughput", rows, f"Sampling speed-up over f9587d4's loop (same run, alternating, best of {args.rounds}, "
          f"outputs bit-identical): {', '.join(notes)}; {args.new_tokens} new tokens, {params:.2f}M parameters, "
          f"{args.threads} threads. Command: python bench/throughput.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
