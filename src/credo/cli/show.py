"""`credo show`: the credit made visible, on traces it samples (credo.lab.show.view) or, with --run RUN --step N,
as a training run logged it (credo.lab.show.run_credit: no model, no sampling)."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, replace

from credo.cli.options import (add_config_options, add_force_option, csv_flags, flag_values, input_paths, require_out,
                               show_config)
from credo.core.config import ConfigError, load_config
from credo.core.files import atomic_write_json
from credo.core.outputs import claim_output
from credo.core.terminal import escape_controls


def cmd_show(args: argparse.Namespace) -> int:
    """`credo show`: a run's logged credit with --run, else a page of sampled traces."""
    if args.run is None and args.step is None:
        return show_sampled(args)
    if args.run is None:
        raise ConfigError("--step N reads a training run's logged credit: give --run RUN too")
    return show_run(args)


def show_sampled(args: argparse.Namespace) -> int:
    """`credo show ...`: sample traces and draw each method's credit on them."""
    # the view, the inputs' checks and the device load torch (~2 s): imported when the command runs, so that
    # `credo --help` stays fast
    from credo.cli.inputs import check_inputs
    from credo.lab.show.view import ShowConfig, run_show
    from credo.policy.device import resolve_device, resolve_dtype
    flags = {**flag_values(args, {"checkpoint": "checkpoint", "task": "task", "n": "n", "k_ref": "k_ref",
                                  "seed": "seed", "device": "device"}), **csv_flags(args, "methods")}
    config = load_config(ShowConfig, args.config, args.set, prefix="show.", flags=flags)
    if args.help_config:
        return show_config(config, "show")
    resolve_dtype(config.dtype, resolve_device(config.device, "show.device"), "show.dtype")  # before --out is claimed
    out = require_out(args)
    policy_dir = check_inputs(config.checkpoint, "show.checkpoint", config.task, config.task_options,
                              "show.task_options.", progress=not args.quiet, max_new_tokens=config.max_new_tokens)
    claim_output(out, "show", force=args.force,  # both the path given and the policy it names (a run's final/)
                 inputs=input_paths(args.config, config.checkpoint, config.task) + (policy_dir,))
    path = run_show(replace(config, checkpoint=policy_dir), out, terminal=args.terminal, progress=not args.quiet)
    print(f"wrote {escape_controls(path)}")  # the path is the user's --out: escaped like any data
    return 0


def show_run(args: argparse.Namespace) -> int:
    """`credo show --run RUN --step N [--out DIR] [--terminal]`: the page to DIR/index.html (with page.json) and/or
    the terminal."""
    # the view loads torch (~2 s): imported when the command runs, so that `credo --help` stays fast
    from credo.lab.show.run_credit import page_from_run
    from credo.lab.show.view import render_terminal, write_page
    from credo.train.credit_log import logged_steps
    run = args.run
    if not os.path.isdir(run):
        raise ConfigError(f"--run {run} is not a directory (a `credo train` run directory)")
    if args.step is None:
        steps = logged_steps(run)
        raise ConfigError(f"--run needs --step N; {run} has credit logged at steps "
                          f"{', '.join(map(str, steps)) if steps else 'none'}")
    if not args.out and not args.terminal:
        raise ConfigError("--run needs --out DIR (the page) or --terminal")
    page = page_from_run(run, int(args.step))
    if args.out:
        claim_output(args.out, "show", force=args.force, inputs=(run,))
        path = write_page(page, args.out)
        atomic_write_json(os.path.join(args.out, "page.json"), asdict(page))
        print(f"wrote {path}")
    if args.terminal:
        render_terminal(page)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`credo show` and its options."""
    p = sub.add_parser("show", help="see the credit: per-token credit of each method on sampled traces, as HTML")
    p.add_argument("--checkpoint", help="a credo checkpoint, a Hugging Face model directory, smollm2-135m or a "
                   "training run (its final/) (default: the task's SFT start)")
    p.add_argument("--task", help="task (default arith; arith-long, gym:<dataset>, jsonl:<path>)")
    p.add_argument("--methods", help="comma-separated estimators, each 'name' or "
                   "'name:key=value:...' as in `credo audit` (default grpo,rredcot)")
    p.add_argument("--n", type=int, help="traces shown, one per held-out prompt (default 8)")
    p.add_argument("--k-ref", type=int, help="MC continuations per boundary for reference values "
                   "beside each step (default 0: none)")
    p.add_argument("--seed", type=int, help="seed of the sampled traces (default 0)")
    add_config_options(p, "ShowConfig", "--set group_size=8")
    p.add_argument("--out", help="directory for index.html (self-contained) and page.json (required)")
    add_force_option(p, "another credo output")
    p.add_argument("--run", help="a `credo train` run directory: show the credit it logged (train.credit_log_every) "
                   "at --step, with its parts, instead of sampling")
    p.add_argument("--step", type=int, help="with --run: the logged step to show")
    p.add_argument("--terminal", action="store_true", help="also print the coloured tokens to the terminal (rich)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(fn=cmd_show)
