"""`credo merge ADAPTER --out DIR`: a LoRA adapter's full weights, a checkpoint every command and transformers load."""

from __future__ import annotations

import argparse
import json
import os

from credo.cli.options import add_force_option, require_out
from credo.core.config import ConfigError
from credo.core.outputs import claim_output


def cmd_merge(args: argparse.Namespace) -> int:
    """`credo merge ADAPTER --out DIR`: a LoRA adapter's full weights (its base with the adapter merged in)."""
    # the policy loads torch (~2 s): imported when the command runs, so that `credo --help` stays fast
    from credo.policy import load_policy
    from credo.policy.adapters import merge_adapter
    from credo.train.starts import resolve_checkpoint
    adapter = resolve_checkpoint(args.adapter, "merge ADAPTER")
    if os.path.abspath(require_out(args)) == os.path.abspath(adapter):
        raise ConfigError(f"--out {args.out} is the adapter itself; name a new directory for the full weights")
    claim_output(args.out, "merge", force=args.force, inputs=(args.adapter, adapter))
    written = merge_adapter(adapter, args.out, load_policy)
    print(json.dumps(written))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`credo merge` and its options."""
    p = sub.add_parser("merge", help="write a LoRA adapter's full weights (its base with the adapter merged in) as a "
                       "checkpoint every command and transformers load")
    p.add_argument("adapter", help="the adapter: a LoRA run's checkpoint or final/ (or the run directory), or a LoRA "
                   "SFT start")
    p.add_argument("--out", help="directory for the full weights (required)")
    add_force_option(p, "another credo output")
    p.set_defaults(fn=cmd_merge)
