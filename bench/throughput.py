"""Tiny-policy throughput: sampling tokens/s with and without the KV cache, and training tokens/s.

Usage: python bench/throughput.py [--batch 64] [--new-tokens 64]. Ratios are taken in one run.
"""

from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import timed, write  # noqa: E402

from credo.policy.base import SamplingConfig, generate  # noqa: E402
from credo.policy.gpt import GPTConfig  # noqa: E402
from credo.policy.tiny import TinyPolicy  # noqa: E402
from credo.sft import make_tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tok = make_tokenizer()
    policy = TinyPolicy.create(GPTConfig(vocab_size=tok.vocab_size), tok)
    policy.model.eval()
    ids, mask = policy.encode_prompts(["37+48-12+55\n"] * args.batch)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)
    no_eos = [tok.eos_id] + tok.banned_ids  # never stop early, so both paths make the same number of tokens

    def with_cache() -> None:
        cache = policy.model.new_cache(args.batch, ids.shape[1] + args.new_tokens)
        with torch.no_grad():
            generate(lambda x, m: policy.model(x, m, cache)[:, -1], ids, mask, sampling,
                     torch.Generator().manual_seed(0), eos_id=-1, pad_id=0, banned_ids=no_eos)

    def without_cache() -> None:
        state = {"ids": None, "mask": None}

        def step(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            state["ids"] = x if state["ids"] is None else torch.cat([state["ids"], x], 1)
            state["mask"] = m if state["mask"] is None else torch.cat([state["mask"], m], 1)
            return policy.model(state["ids"], state["mask"])[:, -1]

        with torch.no_grad():
            generate(step, ids, mask, sampling, torch.Generator().manual_seed(0), eos_id=-1, pad_id=0, banned_ids=no_eos)

    tokens = args.batch * args.new_tokens
    t_cache, t_plain = timed(with_cache), timed(without_cache)
    seq = torch.randint(3, tok.vocab_size, (args.batch, 80))
    opt = torch.optim.AdamW(policy.model.parameters(), lr=1e-4)
    policy.model.train()

    def train_step() -> None:
        logits = policy.model(seq)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    t_train = timed(train_step)
    rows = [
        {"what": "sampling, KV cache", "tokens_per_s": tokens / t_cache, "ratio": 1.0},
        {"what": "sampling, no cache", "tokens_per_s": tokens / t_plain, "ratio": t_cache / t_plain},
        {"what": "training fwd+bwd+AdamW", "tokens_per_s": seq.numel() / t_train, "ratio": float("nan")},
    ]
    write("throughput", rows, f"KV-cache speed-up: {t_plain / t_cache:.1f}x (batch {args.batch}, {args.new_tokens} new tokens, "
                              f"{sum(p.numel() for p in policy.model.parameters()) / 1e6:.2f}M parameters)")


if __name__ == "__main__":
    main()
