"""`credo sft`: the SFT start, of the tiny policy for arith/arith-long (credo.train.sft) or, with --start, a
format/answer SFT of a Hugging Face model (credo.train.sft_hf)."""

from __future__ import annotations

import argparse
import json
import os

from credo.cli.options import add_config_options, add_force_option, input_paths, require_out, show_config
from credo.core.config import MAX_HELD_OUT, ConfigError, from_dict, load_config, merge, to_dict, user_settings
from credo.core.outputs import claim_output
from credo.core.terminal import escape_controls
from credo.train.interrupts import Interrupted


def cmd_sft(args: argparse.Namespace) -> int:
    # the SFT, the policy and the task load torch (~2 s): imported when the command runs, so that `credo --help`
    # stays fast
    from credo.policy import load_policy
    from credo.policy.device import resolve_device
    from credo.tasks.arith import ArithTask
    from credo.train.evaluate import evaluate
    from credo.train.sft import copy_checkpoint, ensure_sft, train_sft
    from credo.train.sft_config import PRESET_TASKS, SFTConfig, check_preset, preset_names, sft_config_for
    if not 1 <= args.eval_n <= MAX_HELD_OUT:
        raise ConfigError(f"sft --eval-n must be in 1..{MAX_HELD_OUT:,}, got {args.eval_n}")
    given = user_settings(args.config, args.set)  # a --config/--set naming a start or a gym/jsonl task: the HF SFT
    named_task = given.get("task") if isinstance(given.get("task"), str) else None  # (the tiny SFT's task is a section)
    hf_task = (args.task or named_task or "arith") not in preset_names()
    if not args.preset and (args.start or given.get("start") or hf_task):
        return cmd_sft_hf(args)
    if args.preset:  # a named start: its own task unless --task says (and agrees)
        args.task = args.task or PRESET_TASKS.get(args.preset, args.preset)
        check_preset(args.preset, args.task, "sft --preset")
    args.task = args.task or "arith"
    preset = args.preset or args.task
    # the tiny SFT start is built on the CPU (cached and shipped by the hash of its config; the CPU build is
    # deterministic): `device` moves its held-out evaluation only, and is no SFTConfig field
    placement = {k: given.pop(k) for k in ("device", "dtype") if k in given}
    device = resolve_device(args.device or placement.get("device", "auto"), "sft.device")
    if placement.get("dtype", "float32") != "float32":
        raise ConfigError(f"sft.dtype={placement['dtype']}: the tiny GPT runs float32 (dtype is for a Hugging Face "
                          "model: give --start)")
    config = from_dict(SFTConfig, merge(to_dict(sft_config_for(preset)), given), prefix="sft.")
    if args.help_config:
        return show_config(config, "sft")
    # before training: refuse a foreign --out up front
    check_snapshots_dir(args.snapshots, args.out)
    claim_output(require_out(args), "sft", force=args.force, inputs=input_paths(args.config))
    try:
        if args.snapshots:  # trained here, beside its snapshots: the cache (and a start it holds) is left alone
            path = os.path.join(args.snapshots, "final")
            train_sft(config, path, progress=not args.quiet, snapshots=args.snapshots)
        else:
            path = ensure_sft(config, force=args.retrain, progress=not args.quiet)
    except Interrupted as stop:
        raise stop.explained(f"stopped by {stop.name}; the tiny SFT keeps no part-way state: the same command "
                             "trains it from the start" + (" (given an empty --snapshots)" if args.snapshots else
                                                           "")) from None
    copy_checkpoint(path, args.out)
    summary_path = os.path.join(args.out, "sft_summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    task = ArithTask(config.task, args.task)
    try:
        result = evaluate(load_policy(args.out, device=device), task, task.heldout_problems(args.eval_n),
                          progress=not args.quiet)
    except Interrupted as stop:
        raise evaluation_stopped(stop, args.out) from None
    print(f"SFT start in {escape_controls(args.out)} (cache {escape_controls(path)}); "
          f"validation accuracy {summary.get('val_accuracy', float('nan')):.3f}")
    print(f"heldout_accuracy={result.accuracy:.4f} (n={result.n})")
    return 0


def cmd_sft_hf(args: argparse.Namespace) -> int:
    """`credo sft --start MODEL --task T`: the format/answer SFT of a Hugging Face model (credo.train.sft_hf)."""
    # the SFT and the policy load torch and transformers: imported when the command runs (as in cmd_sft)
    from credo.policy import load_policy
    from credo.policy.device import autocast_dtype, resolve_device, resolve_dtype
    from credo.train.evaluate import evaluate
    from credo.train.sft_hf import HFSFTConfig, check_sft_inputs, train_hf_sft
    from credo.train.sft_resume import RESUME_DIR
    flags = {k: v for k, v in (("task", args.task), ("start", args.start), ("device", args.device)) if v}
    config = load_config(HFSFTConfig, args.config, args.set, prefix="sft.", flags=flags)
    if args.help_config:
        return show_config(config, "sft")
    if config.task in ("arith", "arith-long"):
        raise ConfigError(f"--task {config.task} has a tiny-GPT SFT start; drop --start (a Hugging Face model "
                          "trains on gym:<dataset> or jsonl:<path> worked solutions)")
    task = check_sft_inputs(config)  # the task, its worked solutions and the start: before --out is touched
    resuming = (bool(args.out) and not args.retrain and not args.force
                and os.path.isdir(os.path.join(args.out, RESUME_DIR)))
    check_snapshots_dir(args.snapshots, args.out, resuming)
    finished = os.path.isfile(os.path.join(require_out(args), "sft_summary.json"))
    if (claim_output(args.out, "sft", force=args.force, inputs=input_paths(args.config, config.start, config.task))
            and finished and not args.retrain):
        raise ConfigError(f"--out {args.out} already holds an SFT start; pass --retrain to train it again")
    if resuming and not args.quiet:
        print(f"credo sft: going on from the part-way SFT in {escape_controls(os.path.join(args.out, RESUME_DIR))}")
    try:
        summary = train_hf_sft(config, args.out, progress=not args.quiet, task=task, snapshots=args.snapshots,
                               resume=not args.retrain)
    except Interrupted as stop:
        raise stop.explained(where_stopped(args.out, stop.name, args.retrain)) from None
    device = resolve_device(config.device, "sft.device")
    try:
        result = evaluate(load_policy(args.out, device=device,
                                      dtype=resolve_dtype(config.dtype, device, "sft.dtype"),
                                      autocast=autocast_dtype(config.dtype)),
                          task, task.heldout_problems(args.eval_n), max_new_tokens=config.max_new_tokens,
                          progress=not args.quiet)
    except Interrupted as stop:
        raise evaluation_stopped(stop, args.out) from None
    print(f"SFT start in {escape_controls(args.out)}: validation accuracy {summary['val_accuracy']:.3f} at step "
          f"{summary['step']} ({summary['seconds']:.0f}s)")
    print(f"heldout_accuracy={result.accuracy:.4f} (n={result.n})")
    return 0


def evaluation_stopped(stop: Interrupted, out: str) -> Interrupted:
    """A stop in the held-out evaluation that follows the SFT: the start is whole, only its measurement is not."""
    return stop.explained(f"stopped by {stop.name} in the held-out evaluation; the start is written in "
                          f"{escape_controls(out)}: `credo eval --checkpoint {escape_controls(out)}` measures it")


def where_stopped(out: str, signal_name: str, retrain: bool = False) -> str:
    """The one line a stopped Hugging Face SFT ends with: the step its part-way state holds, and how to go on."""
    from credo.train.sft_resume import RESUME_DIR, saved_step
    step = saved_step(os.path.join(out, RESUME_DIR))
    if step is None:
        return f"stopped by {signal_name} before its first saved check; the same command starts it again"
    how = "the same command without --retrain" if retrain else "the same command"
    return (f"stopped by {signal_name}; {os.path.join(out, RESUME_DIR)} holds the SFT at step {step}, a validation "
            f"check: {how} goes on from there (--retrain: from the start)")


def check_snapshots_dir(path: str, out: str | None, resuming: bool = False) -> None:
    """--snapshots names a new or empty directory apart from --out: snapshots are never written over what is
    there, and the start's atomic write into --out never replaces them (nor they it). An SFT going on from its
    part-way state (`resuming`) keeps adding to the snapshots its earlier checks wrote (step-N folders only)."""
    if not path:
        return
    # a snapshot being written when the SFT was killed leaves its temporary folder (.tmp-step-N-...): not a snapshot
    found = [n for n in os.listdir(path) if not n.startswith(".tmp-")] if os.path.isdir(path) else []
    earlier = resuming and all(name.startswith("step-") for name in found)
    if os.path.exists(path) and (not os.path.isdir(path) or (found and not earlier)):
        raise ConfigError(f"sft --snapshots {path}: not a new or empty directory"
                          + (" (nor one holding only this SFT's earlier step-N snapshots)" if resuming else ""))
    if out:
        snapshots, start = os.path.realpath(path), os.path.realpath(out)
        if os.path.commonpath([snapshots, start]) in (snapshots, start):
            raise ConfigError(f"sft --snapshots {path}: inside --out {out} or holding it; give two separate "
                              "directories")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`credo sft` and its options."""
    p = sub.add_parser("sft", help="the SFT start: of the tiny policy for arith/arith-long (built or fetched from the "
                       "cache, copied to --out), or with --start a format/answer SFT of a Hugging Face model on a "
                       "gym:/jsonl: task's worked solutions")
    p.add_argument("--out", help="directory to write the SFT checkpoint to (required)")
    p.add_argument("--task", default=None,
                   help="arith or arith-long (their SFT presets), or with --start gym:<dataset> / jsonl:<path> "
                        "(default arith; gym:chain_sum with --start)")
    p.add_argument("--start", default="", help="a Hugging Face model directory or 'smollm2-135m': fine-tune it on "
                   "--task's worked solutions (options: --help-config)")
    add_config_options(p, "SFTConfig (HFSFTConfig with --start)", "--set max_steps=800")
    p.add_argument("--preset", default="", help="a named tiny-GPT SFT start instead of --task's default, e.g. "
                   "arith-long-skilled or arith-long-first (a policy field selects it as 'sft:<name>')")
    p.add_argument("--retrain", action="store_true", help="retrain even when a cached or packaged start exists; "
                   "with --start, train from the start instead of going on from a part-way SFT that --out holds")
    p.add_argument("--snapshots", default="", help="keep the policy of every validation check as a start of its "
                   "own in SNAPSHOTS/step-N (a new or empty directory), to trace or choose a start by more than its "
                   "accuracy, on the validation split (docs/results/arith-long-skilled/scripts/snapshot_premises.py); "
                   "the tiny GPT then trains here (the cache is left alone) with its start in SNAPSHOTS/final; a "
                   "Hugging Face model's LoRA snapshot is its adapter alone")
    add_force_option(p, "another credo output")
    p.add_argument("--eval-n", type=int, default=500, help="held-out problems to report accuracy on (default 500)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_sft)
