"""`credo compare` on the command line: its flags (sugar for CompareConfig fields) and the command.

The command is configured like every other: CompareConfig defaults <- `--config` <- flags <- `--set`;
`--out`, `--force`, `--yes`, `--report-only`, `--status`, `--export` and `--quiet` say where and how it runs, not
what it compares.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import replace

from credo.cli.options import (add_config_options, add_force_option, csv_flags, flag_values, input_paths, require_out,
                               show_config)
from credo.core.config import ConfigError, load_config, to_dict
from credo.core.outputs import claim_output, run_kind
from credo.core.terminal import escape_controls
from credo.train.interrupts import Interrupted


def _int_list(flag: str, text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"compare {flag} must be comma-separated integers (e.g. 0,1,2), got {text!r}") from None


def _schedule(text: str | None) -> dict:
    """--schedule EPOCHSxMINIBATCHES as the epochs/minibatches fields."""
    if not text:
        return {}
    try:
        epochs, minibatches = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--schedule must look like EPOCHSxMINIBATCHES (e.g. 1x4), got {text!r}") from None
    return {"epochs": epochs, "minibatches": minibatches}


def compare_flags(args: argparse.Namespace) -> dict:
    """The CompareConfig fields the flags give."""
    flags = {**flag_values(args, {"preset": "preset", "start": "start", "task": "task", "jobs": "jobs",
                                  "budget": "budget", "lr": "lr", "device": "device", "until": "until",
                                  "export_each": "export_each"}),
             **csv_flags(args, "methods"), **_schedule(args.schedule)}
    seeds = _int_list("--seeds", args.seeds)
    if seeds is not None:
        flags["seeds"] = seeds
    return flags


def _foreign_output(path: str, kind: str) -> bool:
    """Whether --out exists and is not empty nor a credo `kind` directory (claim_output would refuse it)."""
    if not os.path.exists(path):
        return False
    return not os.path.isdir(path) or (bool(os.listdir(path)) and run_kind(path) != kind)


def _preset(config):
    """The comparison `config` (a CompareConfig) describes: its preset with the caller's replacements."""
    from credo.lab.compare.presets import resolve_preset  # the presets load the trainer (torch, ~2 s)
    return resolve_preset(config.preset, config.methods or None, config.seeds, config.budget, config.schedule,
                          config.task or None, config.eval_split, config.audit_n, config.premise_n,
                          to_dict(config.lora))


def cmd_compare(args: argparse.Namespace) -> int:
    # the comparison loads the trainer (torch, ~2 s): imported when the command runs, so that `credo --help`
    # stays fast
    from credo.lab.compare.config import CompareConfig
    from credo.lab.compare.run import rewrite_report
    config = load_config(CompareConfig, args.config, args.set, prefix="compare.", flags=compare_flags(args))
    if args.help_config:
        return show_config(config, "compare")
    out = require_out(args)
    if args.export:  # read-only on --out: safe beside the running comparison
        return _export(args, out, args.export_each)
    if (args.status or args.report_only) and args.export_each:  # (a config file's export_each: the run's, ignored)
        raise ConfigError("--export-each exports a comparison as its runs end, so it takes no --status or "
                          "--report-only (--export DEST copies --out as it is)")
    if args.status:  # read-only: safe beside the running comparison
        from credo.lab.compare.status import status_text  # the status reads the runs' records only when asked
        if not os.path.isdir(os.path.join(out, "runs")):
            raise ConfigError(f"--out {out}: no runs/ directory; nothing of a comparison has started there")
        print(status_text(_preset(config), out, config.jobs))
        return 0
    results = rewrite_report(out) if args.report_only else _run(args, config, out)
    print(open(os.path.join(out, "report.md")).read())
    return 1 if results["failures"] else 0


def _export(args: argparse.Namespace, out: str, export_each: str) -> int:
    """`--export DEST`: --out's finished runs copied into DEST (credo.lab.compare.export)."""
    from credo.lab.compare.export import describe, export  # the export reads the runs' records only when asked
    if args.force or args.report_only or args.status or export_each:
        raise ConfigError("--export copies --out's finished runs and nothing else: it takes no --force, "
                          "--report-only, --status or --export-each")
    print(escape_controls(describe(export(out, args.export), args.export)))  # paths the user gave
    return 0


def _run(args: argparse.Namespace, config, out: str) -> dict:
    """Train and report the comparison `config` (a CompareConfig) into `out`; its results."""
    from credo.cli.inputs import check_inputs  # loads the task and the policy (torch): as the command runs
    from credo.lab.compare.eta import confirm
    from credo.lab.compare.run import check_lora_start, compare, stopped_at
    from credo.policy.device import resolve_device, resolve_dtype
    resolve_dtype(config.dtype, resolve_device(config.device, "compare.device"), "compare.dtype")  # before --out
    if config.start == "sft":  # the task's SFT start, which a comparison's runs record as ''
        config = replace(config, start="")
    check_lora_start(_preset(config), config.start)  # before a named start is built only to be refused
    if config.start:  # before --out is claimed or any run is timed: each run would fail on it
        preset = _preset(config)
        check_inputs(config.start, "compare --start", preset.task, preset.train.get("task_options", {}),
                     "compare.task_options.", progress=not args.quiet)
    interactive = sys.stdin is not None and sys.stdin.isatty()
    inputs = input_paths(args.config, config.start, config.task)
    if config.export_each:  # before --out is replaced or claimed: DEST lies apart from it
        from credo.lab.compare.export import check_dest
        check_dest(out, config.export_each, "--export-each", fresh=args.force)
    if args.force or _foreign_output(out, "compare"):
        # replaced first (its old runs are neither checked nor reused), or refused untouched
        claim_output(out, "compare", force=args.force, inputs=inputs)

    def confirm_then_claim(seconds: float) -> None:
        # otherwise --out is claimed once the run is confirmed: a refused comparison leaves nothing behind
        confirm(seconds, yes=args.yes, interactive=interactive)
        claim_output(out, "compare")

    try:
        return compare(config.preset, out, config.methods or None, config.seeds, start=config.start or None,
                       progress=not args.quiet, jobs=config.jobs, token_budget=config.budget,
                       command=" ".join(["credo", *args.argv]), schedule=config.schedule,
                       task=config.task or None, confirm=confirm_then_claim,
                       report_to=config.report_to, device=config.device, dtype=config.dtype,
                       share_gpu=config.share_gpu, eval_split=config.eval_split,
                       audit_n=config.audit_n, premise_n=config.premise_n, lora=to_dict(config.lora),
                       until=config.until, export_each=config.export_each)
    except Interrupted as stop:  # one line: what finished, and the command that finishes the rest
        raise stopped_at(stop, _preset(config), out, shlex.join(["credo", *args.argv])) from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`credo compare` and its options."""
    p = sub.add_parser("compare", help="train every method from the same start on the same token budget; one report")
    p.add_argument("--preset", help="quick (default; ~6 min, 1 seed, 4 methods), full (3 seeds, every method "
                   "and the shuffled controls), long (arith-long, 12 methods incl. controls, 5 seeds), beyond (long's "
                   "protocol: the free and cheap credit methods and the credo method, with controls), long-skilled "
                   "(round two on a skilled arith-long start, 13 methods, 5 seeds, premise checks at the end; needs "
                   "--start), dapo-credit (long-skilled's protocol, credit methods on DAPO's recipe; needs --start), "
                   "smollm2 (SmolLM2-135M on gym:chain_sum, 2 seeds; needs --start), smollm2-long (round "
                   "two on 5-8 term chains, 3 seeds; needs --start) or smoke (tests)")
    p.add_argument("--methods", help="comma-separated methods to run instead of the preset's, each a name or "
                   "name:key=value (e.g. shuffled:of=rredcot); grpo is always added")
    p.add_argument("--seeds", help="comma-separated seeds instead of the preset's, e.g. 0,1,2")
    p.add_argument("--start", help="start checkpoint (default: the SFT start of the task)")
    p.add_argument("--task", help="task of every run instead of the preset's (arith; long: arith-long)")
    p.add_argument("--out", help="run directory (resumable: finished runs inside it are reused); required")
    p.add_argument("--jobs", type=int,
                   help="trainings run at once, each in its own process with cpu_count/jobs threads (default: the "
                        "preset's); on a GPU one at a time unless --set share_gpu=true")
    p.add_argument("--budget", type=int,
                   help="generated tokens per training run instead of the preset's (evaluated every quarter of it)")
    p.add_argument("--schedule", metavar="EPOCHSxMINIBATCHES",
                   help="optimiser schedule shared by every method, e.g. 1x4 (default: the training defaults); "
                        "a recipe that sets its own keeps it and the report lists it")
    p.add_argument("--lr", type=float, help="learning rate shared by every method (default: the training default); "
                   "a sweep is one comparison per value, each into its own --out")
    p.add_argument("--until", metavar="HH:MM",
                   help="finish what can be finished by this time of day (a machine lent for a fixed time): a run "
                        "whose estimate ends later gives way to the next one that fits; when none fits, the next "
                        "starts anyway and keeps checkpoints (default: plan order)")
    p.add_argument("--export-each", metavar="DEST",
                   help="export --out into DEST (as --export does) as each run ends and again with the report, so "
                        "a machine lost mid-comparison loses only the runs in flight")
    p.add_argument("--yes", action="store_true",
                   help="start even when the estimated wall time is over an hour (otherwise a terminal asks, and a "
                        "non-interactive run stops with a one-line message)")
    add_force_option(p, "another credo output")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild report.md, curves.png and the goal checks from --out's results.json; train nothing")
    p.add_argument("--status", action="store_true",
                   help="print how far the comparison in --out has got (finished seeds' accuracy, paired differences "
                        "to GRPO so far, the time its training, evaluations and premise checks still need); give "
                        "the same --preset/--methods/--seeds as the run; writes nothing")
    p.add_argument("--export", metavar="DEST",
                   help="copy --out's finished runs (config.yaml, metrics.jsonl, summary.json: no weights) and its "
                        "report into DEST (new, empty or an earlier export), a folder small enough to commit or move "
                        "to another machine, from which `credo compare --out DEST` with the run's --preset/--methods/"
                        "--seeds resumes; part-way runs are left out; trains nothing, and is safe beside the running "
                        "comparison")
    add_config_options(p, "CompareConfig", "--set budget=100000")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_compare)
