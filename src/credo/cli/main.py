"""`credo` command line: methods, sft, train, eval, audit, compare, show, merge.

Every command is configured the same way: a frozen dataclass (TrainConfig, SFTConfig, EvalConfig,
AuditConfig, CompareConfig, ShowConfig) loaded from defaults <- `--config FILE.yaml` <- the command's
shortcut flags (sugar for its fields) <- `--set key=value` (repeatable; dotted keys for nested fields,
`--set loss.eps_high=0.28`). `--help-config` lists every field with its doc and value; `--help` the flags.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import replace

import torch

from credo.cli.options import (add_config_options, add_force_option, check_inputs, check_overrides, csv_flags,
                              flag_values, input_paths, require_out, show_config)
from credo.cli.sft import add_sft_parser
from credo.cli.train import flag_settings, resume_config
from credo.train.interrupts import Interrupted, signals_raise
from credo.lab.show.view import escape_controls


def _threads() -> None:
    # CPU runs are fastest with one intra-op thread per physical core; respect an explicit setting.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, min(os.cpu_count() or 1, 8)))


def cmd_methods(args: argparse.Namespace) -> int:
    from credo.train import methods
    from credo.strategies import LOCALISERS, STRATEGIES
    marks = {name: methods.privileged(name) for name, _, _ in methods.describe()}
    marks.update({name: LOCALISERS.get(name).reads_privileged() for name in LOCALISERS.names()})
    rows = methods.describe() + STRATEGIES.describe() + LOCALISERS.describe()
    width = max(len(r[0]) for r in rows)
    print(f"{'name':<{width}}  {'kind':<9}  {'privileged':<10}  description")
    for name, kind, description in rows:
        mark = "-" if kind == "strategy" else "yes" if marks[name] else "no"
        print(f"{name:<{width}}  {kind:<9}  {mark:<10}  {description}")
    print("privileged: reads the task's reference solution, step labels or gold answer beyond the reward "
          "(with its default options; see docs/methods.md)")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from credo.core.config import ConfigError
    from credo.train.trainer import Trainer
    from credo.train.config import load_train_config
    if args.help_config:  # the estimator's options listed field by field, with their docs: its config in `credit`
        from credo.train.plan import make_plan
        config = load_train_config(args.config, args.set, {**flag_settings(args), **_steps(args)})
        return show_config(replace(config, credit=make_plan(config).credit), "train")
    if args.resume:
        config, run_dir = resume_config(args), args.resume
        from credo.core.files import last_checkpoint
        if last_checkpoint(run_dir) is None:
            from credo.train.resume_checks import check_restartable
            check_restartable(run_dir, config)  # a run whose checkpoints were removed is refused, not restarted
            print(f"credo train: {run_dir} never reached a checkpoint; starting it again from step 0", file=sys.stderr)
    else:
        if not args.out:
            raise ConfigError("--out DIR is required (or --resume RUN_DIR)")
        config = load_train_config(args.config, args.set, {**flag_settings(args), **_steps(args)})
        run_dir = args.out
    if args.accept_unrecorded_checkpoint and not args.resume:
        raise ConfigError("--accept-unrecorded-checkpoint applies to --resume RUN_DIR only")
    # task, start and options checked before --out is touched
    trainer = Trainer(config, run_dir, progress=not args.quiet,
                      accept_unrecorded_checkpoint=args.accept_unrecorded_checkpoint)
    inputs = input_paths(args.config, config.start, config.task)
    from credo.train.resume_checks import claim_run
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
    from credo.core.config import UserError
    from credo.train.trainer import TrainingDiverged
    from credo.core.disk_errors import as_disk_error, is_disk_error
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


def cmd_eval(args: argparse.Namespace) -> int:
    from credo.core.config import ConfigError, load_config
    from credo.train.evaluate import EvalConfig, evaluate
    from credo.policy import bind_task, load_policy
    from credo.train.starts import resolve_checkpoint
    from credo.policy.device import autocast_dtype, resolve_device, resolve_dtype
    from credo.tasks import make_task
    known = {f for f in EvalConfig.__dataclass_fields__}
    for item in args.set:  # before EvalConfig, `eval --set` set task options
        key = item.split("=", 1)[0].strip()
        if "=" in item and key.split(".")[0] not in known:
            raise ConfigError(f"eval --set {item}: {key} is not an EvalConfig field; a task option is set as "
                              f"task_options.{key} (--set task_options.{item})")
    config = load_config(EvalConfig, args.config, args.set, prefix="eval.", flags=flag_values(args, {
        "checkpoint": "checkpoint", "task": "task", "n": "n", "k": "k", "max_new_tokens": "max_new_tokens",
        "seed": "seed", "device": "device"}))
    if args.help_config:
        return show_config(config, "eval")
    task = make_task(config.task, config.task_options, prefix="eval.task_options.")
    device = resolve_device(config.device, "eval.device")
    dtype = resolve_dtype(config.dtype, device, "eval.dtype")
    checkpoint = resolve_checkpoint(config.checkpoint, "eval.checkpoint", task=config.task, progress=not args.quiet)
    policy = bind_task(load_policy(checkpoint, device=device, dtype=dtype, autocast=autocast_dtype(config.dtype)),
                       task, check_as="eval.checkpoint", max_new_tokens=config.max_new_tokens)
    result = evaluate(policy, task, task.heldout_problems(config.n), k=config.k, max_new_tokens=config.max_new_tokens,
                      seed=config.seed, progress=not args.quiet)
    print(json.dumps(result.as_dict()))
    print(f"accuracy={result.accuracy:.4f}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from credo.lab.audit.run import AuditConfig, audit_device, checked_methods, run_audit
    from credo.core.config import load_config
    from credo.core.files import claim_output
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
    report = run_audit(replace(config, checkpoint=policy_dir), out, progress=not args.quiet)
    print(open(os.path.join(out, "audit.md")).read())
    failures = report["config"].get("failures", {})
    return 1 if failures else 0


def cmd_merge(args: argparse.Namespace) -> int:
    """`credo merge ADAPTER --out DIR`: a LoRA adapter's full weights (its base with the adapter merged in)."""
    from credo.core.config import ConfigError
    from credo.core.files import claim_output
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


def _add_merge_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("merge", help="write a LoRA adapter's full weights (its base with the adapter merged in) as a "
                       "checkpoint every command and transformers load")
    p.add_argument("adapter", help="the adapter: a LoRA run's checkpoint or final/ (or the run directory), or a LoRA "
                   "SFT start")
    p.add_argument("--out", help="directory for the full weights (required)")
    add_force_option(p, "another credo output")
    p.set_defaults(fn=cmd_merge)


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
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
                   "config.yaml holds the settings; only --steps may change)")
    p.add_argument("--accept-unrecorded-checkpoint", action="store_true",
                   help="with --resume: continue from a checkpoint that holds no record of its config (an older "
                   "credo's, or one whose record was removed) without checking config.yaml against it")
    add_force_option(p, "an earlier run or another credo output")
    add_config_options(p, "TrainConfig", "--set lr=1e-5 --set loss.eps_high=0.28")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_train)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="credo", description="Credit assignment for RL with verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("methods", help="list the registered estimators, recipes, rollout strategies (train.strategy) "
                       "and reset localisers (train.reset.localiser), one per line: name, kind, description")
    p.set_defaults(fn=cmd_methods)

    add_sft_parser(sub)

    _add_train_parser(sub)

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

    _add_merge_parser(sub)

    from credo.lab.compare.cli import add_compare_parser
    add_compare_parser(sub)
    from credo.lab.show.view import add_show_parser
    add_show_parser(sub)

    p = sub.add_parser("eval", help="held-out accuracy of a checkpoint; the last line is accuracy=<float>")
    p.add_argument("--checkpoint", help="a credo checkpoint, a Hugging Face model directory, smollm2-135m or a "
                   "training run (its final/), sft:<preset> (default: the task's SFT start)")
    p.add_argument("--task", help="task name (default arith; arith-long, gym:<dataset>, jsonl:<path>); "
                   "the default --checkpoint is this task's SFT start")
    add_config_options(p, "EvalConfig", "--set task_options.digits=3")
    p.add_argument("--n", type=int, help="held-out problems (default 500)")
    p.add_argument("--k", type=int, help="also report avg@k and pass@k from k samples at temperature 1 (default 0)")
    p.add_argument("--max-new-tokens", type=int, help="generation limit per completion (default 96)")
    p.add_argument("--seed", type=int, help="seed for the sampled (avg@k) completions (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_eval)
    return parser


STOPPABLE = ("train", "compare")
"""The commands a signal stops in one line (credo.train.interrupts): the long-running ones, which can go on."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in run directories
    _threads()
    from credo.core.config import UserError
    try:
        check_overrides(args)
        with signals_raise() if args.command in STOPPABLE else contextlib.nullcontext():
            return args.fn(args)
    except Interrupted as stop:  # Ctrl-C, kill, a closed terminal: not an error, no traceback
        why = stop.message or f"stopped by {stop.name} before it began; run the same command again"
        print(f"credo {args.command}: {why}", file=sys.stderr, flush=True)
        return stop.exit_code
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as err:
        # a user can fix these: one line naming the field, row or file; other exceptions are bugs
        if os.environ.get("CREDO_DEBUG") == "1":
            raise
        return _one_line_error(args.command, " ".join(str(err).split()))
    except Exception as err:
        from credo.core.disk_errors import as_disk_error, is_disk_error
        if not is_disk_error(err) or os.environ.get("CREDO_DEBUG") == "1":
            raise
        return _one_line_error(args.command, str(as_disk_error(err)))


def _one_line_error(command: str, message: str) -> int:
    # a path or value from the user or a data file may hold terminal escapes
    print(f"credo {command}: error: {escape_controls(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
