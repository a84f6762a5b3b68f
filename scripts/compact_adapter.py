"""Writes a copy of a saved LoRA adapter with its weights in bfloat16 (half float32's bytes): how an adapter
start is made small enough to commit. The copy loads as any adapter does (`--start OUT`), its weights the
original's rounded to bfloat16; on the SmolLM2 localisation adapter (rank 16, every linear layer) that rounding
left all 32 greedy held-out completions the same and moved token log-probabilities by 1.2e-5 nats on average
(max 0.0015; docs/results/smollm2-localise/README.md).

    python scripts/compact_adapter.py ADAPTER_DIR OUT_DIR [--dtype bfloat16|float16]
"""

from __future__ import annotations

import argparse
import sys

from credo.core.config import UserError
from credo.policy.adapters import STORED_DTYPES, compact_adapter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("adapter", help="a saved LoRA adapter directory (a run's final/ or a checkpoint)")
    parser.add_argument("out", help="the new directory to write (refused if it exists)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(STORED_DTYPES),
                        help="the dtype its weights are stored in (default: bfloat16)")
    args = parser.parse_args(argv)
    try:
        done = compact_adapter(args.adapter, args.out, args.dtype)
    except UserError as err:
        print(f"compact_adapter: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the copy is written whole or not at all
        print(f"compact_adapter: interrupted; {args.out} was not written", file=sys.stderr)
        return 130
    print(f"{done['out']}: {done['bytes_before']:,} -> {done['bytes_after']:,} bytes ({done['dtype']}; largest "
          f"rounding of a weight {done['max_rounding']:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
