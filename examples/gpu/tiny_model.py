"""Write a tiny random Llama (2 layers, 32 wide) and its BPE tokenizer to a directory: the model
`examples/gpu/acceptance.sh --dry-run` runs on the CPU in place of SmolLM2-135M (built from a config, no hub).

    python examples/gpu/tiny_model.py OUT_DIR
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from builders import build_tokenizer, tiny_llama  # noqa: E402  (the test suite's tiny model, one definition)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/gpu/tiny_model.py OUT_DIR")
    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer)
    model.save_pretrained(sys.argv[1])
    tokenizer.save_pretrained(sys.argv[1])
    print(sys.argv[1])


if __name__ == "__main__":
    main()
