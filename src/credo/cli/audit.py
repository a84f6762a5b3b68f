"""`credo audit`: each estimator's segment credit scored against Monte Carlo reference values (credo.lab.audit.run);
the command writes audit.html, the audit's tables beside a `credo show` grid of its traces (credo.lab.show.view)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from credo.cli.options import (add_config_options, add_force_option, csv_flags, flag_values, input_paths, require_out,
                               show_config)
from credo.core.config import load_config
from credo.core.outputs import claim_output


def cmd_audit(args: argparse.Namespace) -> int:
    # the audit loads the policy and the estimators (torch, ~2 s): imported when the command runs, so that
    # `credo --help` stays fast
    from credo.cli.inputs import check_inputs
    from credo.lab.audit.config import AuditConfig
    from credo.lab.audit.reference import audit_device
    from credo.lab.audit.report import checked_methods
    from credo.lab.audit.run import run_audit
    from credo.lab.show.view import write_audit_page
    flags = {**flag_values(args, {"checkpoint": "checkpoint", "task": "task", "n": "n", "group_size": "group_size",
                                  "k_ref": "k_ref", "seed": "seed", "device": "device"}),
             **csv_flags(args, "methods", "localisers")}
    config = load_config(AuditConfig, args.config, args.set, prefix="audit.", flags=flags)
    if args.help_config:
        return show_config(config, "audit")
    checked_methods(config.methods)  # unknown estimators and options fail before any sampling starts
    audit_device(config)  # a device the machine lacks: one line before --out is claimed
    out = require_out(args)
    policy_dir = check_inputs(config.checkpoint, "audit.checkpoint", config.task, config.task_options,
                              "audit.task_options.", progress=not args.quiet, max_new_tokens=config.max_new_tokens,
                              system_prompt=False)
    claim_output(out, "audit", force=args.force,  # both the path given and the policy it names (a run's final/)
                 inputs=input_paths(args.config, config.checkpoint, config.task) + (policy_dir,))
    audit = run_audit(replace(config, checkpoint=policy_dir), out, progress=not args.quiet)
    write_audit_page(out, audit)
    print(open(os.path.join(out, "audit.md")).read())
    failures = audit.report["config"].get("failures", {})
    return 1 if failures else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`credo audit` and its options."""
    p = sub.add_parser("audit", help="score estimators' segment credit against Monte Carlo reference values")
    p.add_argument("--checkpoint", help="a credo checkpoint, a Hugging Face model directory, smollm2-135m or a "
                   "training run (its final/), sft:<preset> (default: the task's SFT start)")
    p.add_argument("--task", help="task: arith (default), arith-long, gym:<dataset>, jsonl:<path>; the default "
                   "--checkpoint is this task's SFT start")
    p.add_argument("--n", type=int, help="held-out traces to audit (default 256)")
    p.add_argument("--group-size", type=int, help="traces sampled per prompt (default 8)")
    p.add_argument("--k-ref", type=int, help="MC continuations per segment boundary for the reference (default 32)")
    p.add_argument("--methods", help="comma-separated estimators, each 'name' or 'name:key=value:...' "
                   "(default vineppo, at k=4); random, grpo and first_step floors are always included")
    p.add_argument("--localisers", help="comma-separated reset localisers to score against the first "
                   "wrong step: random, value, oracle, self (prompt needs a model that "
                   "can read the request: a chat model, or sft:arith-long-skilled)")
    p.add_argument("--seed", type=int, help="seed of the sampled traces and the reference (default 0)")
    add_config_options(p, "AuditConfig", "--set segmenter=lines")
    p.add_argument("--out", help="directory for audit.json, audit.md, audit.png (required)")
    add_force_option(p, "another credo output")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(fn=cmd_audit)
