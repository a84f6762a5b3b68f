"""`credo train`: RL-train a policy with a credit-assignment method, or continue a run (--resume: credo.cli.resume).
The shortcut flags are training fields (`flag_settings`); the run is planned once (credo.train.plan.plan_run) and the
trainer takes that plan."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from credo.cli.options import add_config_options, add_force_option, flag_values, input_paths, show_config
from credo.core.config import ConfigError, UserError, user_settings
from credo.core.disk_errors import as_disk_error, is_disk_error
from credo.core.files import last_checkpoint
from credo.train.interrupts import Interrupted


def flag_settings(args: argparse.Namespace) -> dict:
    """The training fields named by shortcut flags (--method, --start, --seed, --task, --localiser)."""
    extra = {k: v for k, v in flag_values(args, {"method": "method", "start": "start", "seed": "seed",
                                                 "task": "task", "device": "device"}).items() if v != ""}
    if args.localiser:
        extra["reset"] = {"localiser": args.localiser}
    return extra


def cmd_train(args: argparse.Namespace) -> int:
    # the trainer loads torch (~2 s): imported when the command runs, so that `credo --help` stays fast
    from credo.cli.resume import resume_config
    from credo.train.plan import plan_run
    from credo.train.resume_checks import check_restartable, claim_run
    from credo.train.trainer import Trainer
    if args.help_config:  # the estimator's options listed field by field, with their docs: its config in `credit`
        config, plan = plan_run(args.config, args.set, {**flag_settings(args), **_steps(args)})
        return show_config(replace(config, credit=plan.credit), "train")
    if args.resume:
        requested = user_settings(args.config, args.set, flag_settings(args))  # --config, the flags, --set
        (config, plan), run_dir = resume_config(args, requested), args.resume
        if last_checkpoint(run_dir) is None:
            check_restartable(run_dir, config)  # a run whose checkpoints were removed is refused, not restarted
            print(f"credo train: {run_dir} never reached a checkpoint; starting it again from step 0", file=sys.stderr)
    else:
        if not args.out:
            raise ConfigError("--out DIR is required (or --resume RUN_DIR)")
        config, plan = plan_run(args.config, args.set, {**flag_settings(args), **_steps(args)})
        run_dir = args.out
    if args.accept_unrecorded_checkpoint and not args.resume:
        raise ConfigError("--accept-unrecorded-checkpoint applies to --resume RUN_DIR only")
    # task, start and options checked before --out is touched
    trainer = Trainer(config, run_dir, progress=not args.quiet,
                      accept_unrecorded_checkpoint=args.accept_unrecorded_checkpoint, plan=plan)
    inputs = input_paths(args.config, config.start, config.task)
    if not args.resume and claim_run(run_dir, args.force, inputs, config):
        print(f"credo train: {run_dir} holds a run that never reached a checkpoint; replacing it", file=sys.stderr)
        claim_run(run_dir, True, inputs, config)
    try:
        summary = _train_with_guidance(trainer, run_dir)
    except Interrupted as stop:
        raise stop.explained(_where_stopped(trainer, run_dir)) from None
    rows = trainer.log.rows()
    start = next((r["eval_accuracy"] for r in rows if r.get("step") == 0 and "eval_accuracy" in r), None)
    print(json.dumps(summary))
    if start is not None and "final_accuracy" in summary:
        start_n = len(trainer.task.heldout_problems(config.eval_n))
        print(f"start_accuracy={start:.4f} (n={start_n}) final_accuracy={summary['final_accuracy']:.4f} "
              f"(n={summary['final_eval_n']}) in {summary['seconds']:.0f}s")
    return 0


def _where_stopped(trainer, run_dir: str) -> str:
    """The one line of a training run stopped by a signal: how far it got, and how to go on from its last
    checkpoint (which the resume continues bit-identically)."""
    last = trainer.last_checkpoint()
    if last is None:
        return (f"interrupted at step {trainer.step} of {trainer.config.steps}, before the first checkpoint; run the "
                f"same command again to start it over (or `credo train --resume {run_dir}`)")
    return (f"interrupted at step {trainer.step} of {trainer.config.steps}; the last checkpoint is step "
            f"{int(os.path.basename(last).split('-')[-1])}; resume with `credo train --resume {run_dir}`")


def _steps(args: argparse.Namespace) -> dict:
    return {"steps": args.steps} if args.steps is not None else {}


def _train_with_guidance(trainer, run_dir: str) -> dict:
    """Train; a user error (or a full disk) that stops the run also says how to go on from the directory it
    leaves."""
    from credo.train.step import TrainingDiverged  # loaded with the trainer, as the command runs
    try:
        return trainer.train()
    except TrainingDiverged:
        raise  # names the step and the last good checkpoint itself
    except Exception as caught:
        if not (isinstance(caught, UserError) or is_disk_error(caught)):
            raise  # a bug: its traceback
        if trainer.last_checkpoint() is None:
            hint = f"{run_dir} never reached a checkpoint: fix the cause and run the same `credo train --out` again"
        else:
            hint = f"once fixed, continue with --resume {run_dir}, or start over with --out {run_dir} --force"
        if is_disk_error(caught):  # a full disk too says how to go on, after what to free
            raise as_disk_error(caught, then=f" ({hint})") from caught
        raise type(caught)(f"{caught} ({hint})") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`credo train` and its options."""
    p = sub.add_parser("train", help="RL-train a policy with a credit-assignment method")
    p.add_argument("--method", help="estimator or recipe name (see `credo methods`; default grpo)")
    p.add_argument("--out", help="run directory to create (config, metrics.jsonl, checkpoints, final/)")
    p.add_argument("--steps", type=int, help="optimisation steps (default: train.steps, 150; with --resume it "
                   "extends the run, never shortens it)")
    p.add_argument("--start", help="policy to start from: a credo checkpoint, a Hugging Face model directory or "
                   "'smollm2-135m' (default: the task's SFT start)")
    p.add_argument("--task", help="task: arith (default), arith-long, gym:<reasoning-gym dataset>, jsonl:<path>; "
                   "the default --start is this task's SFT start")
    p.add_argument("--seed", type=int, help="random seed of the run, 0..2**32-1 (default 0)")
    p.add_argument("--localiser", help="reset localiser for rrpo/srpo: random, value, prompt, oracle or self (prompt "
                   "where the task has a localisation request, else value)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint (its "
                   "config.yaml holds the settings; only --steps, upwards, --device and --set report_to=... may "
                   "change)")
    p.add_argument("--accept-unrecorded-checkpoint", action="store_true",
                   help="with --resume: continue from a checkpoint that holds no record of its config (an older "
                   "credo's, or one whose record was removed) without checking config.yaml against it")
    add_force_option(p, "an earlier run or another credo output")
    add_config_options(p, "TrainConfig", "--set lr=1e-5 --set loss.eps_high=0.28")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_train)
