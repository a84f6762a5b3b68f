"""Where the tiny GPT's sampling time goes at batch 64 (the speed goal's setting), by kind of operation, with
the arithmetic rate of its linear layers: the floor that any sampling loop pays, whatever its Python overhead.

Usage: python bench/sampling_profile.py [--batch 64] [--new-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import write  # noqa: E402

from credo.core.protocols import SamplingConfig  # noqa: E402
from credo.policy.base import generate  # noqa: E402
from credo.policy.gpt import GPTConfig  # noqa: E402
from credo.policy.tiny import TinyPolicy, cached_step  # noqa: E402
from credo.train.sft import make_tokenizer  # noqa: E402

KINDS = {"linear layers (addmm, mm)": ("aten::addmm", "aten::mm"),
         "attention over the cache (bmm, sdpa)": ("aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu"),
         "cache writes and copies (copy_)": ("aten::copy_",),
         "GELU, LayerNorm, softmax": ("aten::gelu", "aten::native_layer_norm", "aten::_softmax",
                                      "aten::_log_softmax"),
         "token draw (multinomial)": ("aten::multinomial", "aten::exponential_")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = make_tokenizer()
    policy = TinyPolicy.create(GPTConfig(vocab_size=tok.vocab_size), tok)
    model = policy.model.eval()
    ids, mask = policy.encode_prompts(["37+48-12+55\n"] * args.batch)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)

    def sample() -> None:
        step = cached_step(model, model.new_cache(args.batch, ids.shape[1] + args.new_tokens))
        generate(step, ids, mask, sampling, torch.Generator().manual_seed(0), eos_id=-1, pad_id=0,
                 banned_ids=[tok.eos_id] + tok.banned_ids)

    with torch.no_grad():
        sample()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sample()
    self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(self_us.values())
    rows = []
    for kind, ops in KINDS.items():
        spent = sum(self_us.get(op, 0.0) for op in ops)
        rows.append({"kind": kind, "share_of_sampling_time": spent / total})
    rows.append({"kind": "everything else (Python-side tensor bookkeeping)",
                 "share_of_sampling_time": 1 - sum(r["share_of_sampling_time"] for r in rows)})
    blocks = model.config.n_layer * 12 * model.config.d_model ** 2 + model.config.d_model * model.config.vocab_size
    flops = 2 * blocks * args.batch * args.new_tokens  # the decode steps' linear layers
    linear_s = (self_us.get("aten::addmm", 0.0) + self_us.get("aten::mm", 0.0)) / 1e6
    write("sampling_profile", rows,
          f"Tiny GPT ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters), batch {args.batch}, "
          f"{args.new_tokens} new tokens, {args.threads} thread(s), one profiled call: {total / 1e6:.3f} s. The "
          f"linear layers run at {flops / linear_s / 1e9:.0f} GFLOP/s; with every other kind of operation at zero "
          f"cost the loop would be {1 / max(rows[0]['share_of_sampling_time'], 1e-9):.1f}x faster than now. "
          f"Command: python bench/sampling_profile.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
