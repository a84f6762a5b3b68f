"""`credo` command line: methods, sft, train, eval, audit, compare, show.

Every command answers --help. Config overrides use `--set key=value` (repeatable), with dotted
keys for nested fields (`--set loss.eps_high=0.28`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def _threads() -> None:
    # CPU runs are fastest with one intra-op thread per physical core; respect an explicit setting.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, min(os.cpu_count() or 1, 8)))


def cmd_methods(args: argparse.Namespace) -> int:
    from credo import methods
    from credo.strategies import LOCALISERS, STRATEGIES
    rows = methods.describe() + STRATEGIES.describe() + LOCALISERS.describe()
    width = max(len(r[0]) for r in rows)
    for name, kind, description in rows:
        print(f"{name:<{width}}  {kind:<9}  {description}")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from credo.config import load_config
    from credo.config import to_dict
    from credo.runs import claim_output
    from credo.sft import SFTConfig, copy_checkpoint, ensure_sft, sft_config_for
    config = load_config(SFTConfig, args.config, args.set, prefix="sft.", base=to_dict(sft_config_for(args.task)))
    claim_output(args.out, "sft", force=args.force)  # before training: refuse a foreign --out up front
    path = ensure_sft(config, force=args.retrain, progress=not args.quiet)
    copy_checkpoint(path, args.out)
    summary_path = os.path.join(args.out, "sft_summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    from credo.evaluate import evaluate
    from credo.policy import load_policy
    from credo.tasks.arith import ArithTask
    task = ArithTask(config.task, args.task)
    result = evaluate(load_policy(args.out), task, task.heldout_problems(args.eval_n), progress=not args.quiet)
    print(f"SFT start in {args.out} (cache {path}); validation accuracy {summary.get('val_accuracy', float('nan')):.3f}")
    print(f"heldout_accuracy={result.accuracy:.4f} (n={result.n})")
    return 0


def _flag_settings(args: argparse.Namespace) -> dict:
    """The training fields named by dedicated flags (--method, --start/--model, --seed, --task, --localiser)."""
    extra: dict = {}
    for key in ("method", "start", "seed", "task"):
        value = getattr(args, key)
        if value not in (None, ""):
            extra[key] = value
    if args.model:
        extra["start"] = args.model
    if args.localiser:
        extra["reset"] = {"localiser": args.localiser}
    return extra


def _requested_settings(args: argparse.Namespace) -> dict:
    """Every training field the command line names: --config, then the flags, then --set."""
    from credo.config import merge, parse_overrides
    from credo.train_config import _read_yaml
    return merge(merge(_read_yaml(args.config), _flag_settings(args)), parse_overrides(args.set))


def _resume_config(args: argparse.Namespace):
    from dataclasses import replace
    from credo.config import ConfigError
    from credo.train import config_from_run
    from credo.train_config import resume_differences
    if args.out and os.path.abspath(args.out) != os.path.abspath(args.resume):
        raise ConfigError(f"--resume continues {args.resume} in place; --out {args.out} names another directory")
    config = config_from_run(args.resume)
    if args.steps:
        config = replace(config, steps=args.steps)  # extending a run is allowed
    differences = resume_differences(config, _requested_settings(args))
    if differences:
        raise ConfigError(f"--resume {args.resume}: the command differs from the run's config.yaml: "
                          + "; ".join(differences) + " (drop those options, or start a new run with --out)")
    return config


def cmd_train(args: argparse.Namespace) -> int:
    from credo.config import ConfigError
    from credo.train import Trainer, load_train_config
    if args.resume:
        config, run_dir = _resume_config(args), args.resume
        if not os.path.isdir(os.path.join(run_dir, "checkpoints")):
            print(f"credo train: {run_dir} never reached a checkpoint; starting it again from step 0", file=sys.stderr)
    else:
        if not args.out:
            raise ConfigError("--out DIR is required (or --resume RUN_DIR)")
        extra = _flag_settings(args)
        if args.steps:
            extra["steps"] = args.steps
        config = load_train_config(args.config, args.set, extra)
        run_dir = args.out
    trainer = Trainer(config, run_dir, progress=not args.quiet)  # task, start and options checked before --out is touched
    if not args.resume and _claim_run(run_dir, args.force):
        print(f"credo train: {run_dir} holds a run that never reached a checkpoint; replacing it", file=sys.stderr)
        _claim_run(run_dir, True)
    summary = _train_with_guidance(trainer, run_dir)
    rows = trainer.log.rows()
    start = next((r["eval_accuracy"] for r in rows if r.get("step") == 0 and "eval_accuracy" in r), None)
    print(json.dumps(summary))
    if start is not None and "final_accuracy" in summary:
        start_n = len(trainer.task.heldout_problems(config.eval_n))
        print(f"start_accuracy={start:.4f} (n={start_n}) final_accuracy={summary['final_accuracy']:.4f} "
              f"(n={summary['final_eval_n']}) in {summary['seconds']:.0f}s")
    return 0


def _train_with_guidance(trainer, run_dir: str) -> dict:
    """Train; a user error that stops the run also says how to go on from the directory it leaves."""
    from credo.config import UserError
    from credo.train import TrainingDiverged
    try:
        return trainer.train()
    except TrainingDiverged:
        raise  # names the step and the last good checkpoint itself
    except UserError as err:
        if trainer.last_checkpoint() is None:
            hint = f"{run_dir} never reached a checkpoint: fix the cause and run the same `credo train --out` again"
        else:
            hint = f"once fixed, continue with --resume {run_dir}, or start over with --out {run_dir} --force"
        raise type(err)(f"{err} ({hint})") from None


def _claim_run(run_dir: str, force: bool) -> bool:
    """Claim --out for a new training run; True if it holds an earlier run with nothing worth keeping."""
    from credo.config import ConfigError
    from credo.runs import claim_output
    if not claim_output(run_dir, "train", force=force):
        return False
    if os.path.isdir(os.path.join(run_dir, "checkpoints")) or os.path.exists(os.path.join(run_dir, "final")):
        raise ConfigError(f"{run_dir} already holds a run; continue it with --resume {run_dir}, or replace it with --force")
    return True


def cmd_eval(args: argparse.Namespace) -> int:
    from credo.config import ConfigError, parse_overrides
    from credo.evaluate import evaluate
    from credo.policy import bind_task, load_policy
    from credo.tasks import make_task
    for flag, value, low in (("--n", args.n, 1), ("--k", args.k, 0), ("--max-new-tokens", args.max_new_tokens, 1)):
        if value < low:
            raise ConfigError(f"eval {flag} must be >= {low}, got {value}")
    checkpoint = args.checkpoint
    if checkpoint in (None, "", "sft"):
        from credo.sft import ensure_sft
        checkpoint = ensure_sft(progress=not args.quiet, task=args.task)
    elif os.path.isdir(os.path.join(checkpoint, "final")):
        checkpoint = os.path.join(checkpoint, "final")  # a run directory: evaluate its final policy
    task = make_task(args.task, parse_overrides(args.set or []))
    if os.path.isdir(checkpoint):
        from credo.state_io import check_safetensors
        check_safetensors(checkpoint)
    policy = bind_task(load_policy(checkpoint), task)
    result = evaluate(policy, task, task.heldout_problems(args.n), k=args.k, max_new_tokens=args.max_new_tokens,
                      seed=args.seed, progress=not args.quiet)
    print(json.dumps(result.as_dict()))
    print(f"accuracy={result.accuracy:.4f}")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from credo.audit import AuditConfig, run_audit
    from credo.config import from_dict, parse_overrides
    from credo.runs import claim_output
    values = parse_overrides(args.set or [])
    values.update({"checkpoint": args.checkpoint or "", "n": args.n, "k_ref": args.k_ref, "seed": args.seed,
                   "group_size": args.group_size, "methods": [m for m in args.methods.split(",") if m],
                   "localisers": [m for m in args.localisers.split(",") if m]})
    if args.task:
        values["task"] = args.task
    config = from_dict(AuditConfig, values, prefix="audit.")
    _check_audit_methods(config.methods)
    claim_output(args.out, "audit", force=args.force)
    report = run_audit(config, args.out, progress=not args.quiet)
    print(open(os.path.join(args.out, "audit.md")).read())
    failures = report["config"].get("failures", {})
    return 1 if failures else 0


def _check_audit_methods(specs: tuple[str, ...]) -> None:
    """Each --methods entry names a registered estimator with valid options (before any sampling starts)."""
    from credo.audit import checked_methods
    checked_methods(specs)


def _int_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    from credo.config import ConfigError
    if not text:
        return None
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ConfigError(f"compare {flag} must be comma-separated integers (e.g. 0,1,2), got {text!r}") from None


def _schedule(args: argparse.Namespace) -> dict:
    """--schedule EPOCHSxMINIBATCHES and --lr as the shared schedule of a comparison."""
    from credo.config import ConfigError
    schedule: dict = {}
    if args.schedule:
        try:
            epochs, minibatches = (int(x) for x in args.schedule.lower().split("x"))
        except ValueError:
            raise ConfigError(f"--schedule must look like EPOCHSxMINIBATCHES (e.g. 1x4), got {args.schedule!r}") from None
        if epochs < 1 or minibatches < 1:
            raise ConfigError(f"--schedule: epochs and mini-batches must be >= 1, got {args.schedule!r}")
        schedule.update(epochs=epochs, minibatches=minibatches)
    if args.lr is not None:
        if not args.lr > 0:
            raise ConfigError(f"--lr must be > 0, got {args.lr}")
        schedule["lr"] = args.lr
    return schedule


def _foreign_output(path: str, kind: str) -> bool:
    """Whether --out exists and is not empty nor a credo `kind` directory (claim_output would refuse it)."""
    from credo.runs import run_kind
    if not os.path.exists(path):
        return False
    return not os.path.isdir(path) or (bool(os.listdir(path)) and run_kind(path) != kind)


def cmd_compare(args: argparse.Namespace) -> int:
    from credo.compare import PRESETS, compare
    from credo.compare_eta import confirm
    from credo.config import ConfigError
    from credo.runs import claim_output
    methods = tuple(m for m in (args.methods or "").split(",") if m) or None
    seeds = _int_list("--seeds", args.seeds)
    if args.budget is not None and args.budget <= 0:
        raise ConfigError(f"compare --budget must be a positive number of generated tokens, got {args.budget}")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"compare --jobs must be >= 1, got {args.jobs}")
    if args.preset not in PRESETS:
        raise ConfigError(f"compare --preset must be one of {', '.join(PRESETS)}, got {args.preset!r}")
    if args.report_only:
        from credo.compare import rewrite_report
        results = rewrite_report(args.out)
    else:
        interactive = sys.stdin is not None and sys.stdin.isatty()
        schedule = _schedule(args)
        if args.force or _foreign_output(args.out, "compare"):
            # replaced first (its old runs are neither checked nor reused), or refused untouched
            claim_output(args.out, "compare", force=args.force)

        def confirm_then_claim(seconds: float) -> None:
            # otherwise --out is claimed once the run is confirmed: a refused comparison leaves nothing behind
            confirm(seconds, yes=args.yes, interactive=interactive)
            claim_output(args.out, "compare")

        results = compare(args.preset, args.out, methods, seeds, start=args.start, progress=not args.quiet,
                          jobs=args.jobs, token_budget=args.budget, command=" ".join(["credo", *args.argv]),
                          schedule=schedule, task=args.task, confirm=confirm_then_claim)
    print(open(os.path.join(args.out, "report.md")).read())
    return 1 if results["failures"] else 0


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="RL-train a policy with a credit-assignment method")
    p.add_argument("--method", help="estimator or recipe name (see `credo methods`; default grpo)")
    p.add_argument("--out", help="run directory to create (config, metrics.jsonl, checkpoints, final/)")
    p.add_argument("--config", help="YAML file of TrainConfig fields")
    p.add_argument("--steps", type=int, help="number of optimisation steps")
    p.add_argument("--start", help="policy checkpoint to start from (default: the task's SFT start)")
    p.add_argument("--model", help="a Hugging Face model directory or 'smollm2-135m' (same as --start)")
    p.add_argument("--task", help="task: arith (default), arith-long, gym:<reasoning-gym dataset>, jsonl:<path>; "
                   "the default --start is this task's SFT start")
    p.add_argument("--seed", type=int, help="random seed of the run")
    p.add_argument("--localiser", help="reset localiser for rrpo/srpo: random, value, prompt, oracle or self (prompt where the task has a localisation request, else value)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint (its "
                   "config.yaml holds the settings; only --steps may change)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out (an earlier run or any other files)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set lr=1e-5 --set loss.eps_high=0.28 (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_train)


def _add_compare_parser(sub: argparse._SubParsersAction) -> None:
    """`credo compare` and its options."""
    p = sub.add_parser("compare", help="train every method from the same start on the same token budget; one report")
    p.add_argument("--preset", default="quick", help="quick (~15 min, 1 seed, 4 methods), full (3 seeds, every method "
                   "and the shuffled controls), long (arith-long, 12 methods incl. controls, 5 seeds) or smoke (tests)")
    p.add_argument("--methods", help="comma-separated methods to run instead of the preset's, each a name or "
                   "name:key=value (e.g. shuffled:of=rredcot); grpo is always added")
    p.add_argument("--seeds", help="comma-separated seeds instead of the preset's, e.g. 0,1,2")
    p.add_argument("--start", help="start checkpoint (default: the SFT start of the task)")
    p.add_argument("--task", help="task of every run instead of the preset's (arith; long: arith-long)")
    p.add_argument("--out", required=True, help="run directory (resumable: finished runs inside it are reused)")
    p.add_argument("--jobs", type=int,
                   help="trainings run at once, each in its own process with cpu_count/jobs threads (default: the preset's)")
    p.add_argument("--budget", type=int,
                   help="generated tokens per training run instead of the preset's (evaluated every quarter of it)")
    p.add_argument("--schedule", metavar="EPOCHSxMINIBATCHES",
                   help="optimiser schedule shared by every method, e.g. 1x4 (default: the training defaults); "
                        "a recipe that sets its own keeps it and the report lists it")
    p.add_argument("--lr", type=float, help="learning rate shared by every method (default: the training default); "
                   "a sweep is one comparison per value, each into its own --out")
    p.add_argument("--yes", action="store_true",
                   help="start even when the estimated wall time is over an hour (otherwise a terminal asks, and a "
                        "non-interactive run stops with a one-line message)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out that is not a compare directory")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild report.md, curves.png and the goal checks from --out's results.json; train nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_compare)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="credo", description="Credit assignment for RL with verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("methods", help="list the registered estimators, recipes, rollout strategies (train.strategy) and "
                       "reset localisers (train.reset.localiser), one per line: name, kind, description")
    p.set_defaults(fn=cmd_methods)

    p = sub.add_parser("sft", help="build (or fetch from cache) the SFT start of the tiny policy and copy it to --out")
    p.add_argument("--out", required=True, help="directory to write the SFT checkpoint to")
    p.add_argument("--task", default="arith", choices=["arith", "arith-long"],
                   help="arithmetic task whose SFT preset to start from (default arith)")
    p.add_argument("--config", help="YAML file of SFTConfig fields")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (repeatable)")
    p.add_argument("--retrain", action="store_true", help="retrain even when a cached or packaged start exists")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out that is not an SFT checkpoint")
    p.add_argument("--eval-n", type=int, default=500, help="held-out problems to report accuracy on (default 500)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_sft)

    _add_train_parser(sub)

    p = sub.add_parser("audit", help="score estimators' segment credit against Monte Carlo reference values")
    p.add_argument("--checkpoint", help="policy directory (default: the SFT start)")
    p.add_argument("--task", help="task: arith (default), arith-long, gym:<dataset>, jsonl:<path>; the default "
                   "--checkpoint is this task's SFT start")
    p.add_argument("--n", type=int, default=256, help="held-out traces to audit (default 256)")
    p.add_argument("--group-size", type=int, default=8, help="traces sampled per prompt (default 8)")
    p.add_argument("--k-ref", type=int, default=32, help="MC continuations per segment boundary for the reference (default 32)")
    p.add_argument("--methods", default="vineppo", help="comma-separated estimators, each 'name' or 'name:key=value:...' "
                   "(default vineppo, at k=4); random, grpo and first_step floors are always included")
    p.add_argument("--localisers", default="", help="comma-separated reset localisers to score against the first "
                   "wrong step: random, value, oracle (prompt needs a chat model)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled traces and the reference")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="other AuditConfig fields (repeatable)")
    p.add_argument("--out", required=True, help="directory for audit.json, audit.md, audit.png")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out that is not an audit directory")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(fn=cmd_audit)

    _add_compare_parser(sub)
    from credo.show import add_show_parser
    add_show_parser(sub)

    p = sub.add_parser("eval", help="held-out accuracy of a checkpoint; the last line is accuracy=<float>")
    p.add_argument("--checkpoint", default="sft", help="policy directory or run directory (default: the SFT start)")
    p.add_argument("--task", default="arith", help="task name (default arith; arith-long, gym:<dataset>, jsonl:<path>); "
                   "the default --checkpoint is this task's SFT start")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="task option override (repeatable)")
    p.add_argument("--n", type=int, default=500, help="held-out problems (default 500)")
    p.add_argument("--k", type=int, default=0, help="also report avg@k and pass@k from k samples at temperature 1")
    p.add_argument("--max-new-tokens", type=int, default=96, help="generation limit per completion (default 96)")
    p.add_argument("--seed", type=int, default=0, help="seed for the sampled (avg@k) completions")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in run directories
    _threads()
    from credo.config import UserError
    try:
        return args.fn(args)
    except (UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as err:
        # a user can fix these: one line naming the field, row or file; other exceptions are bugs
        if os.environ.get("CREDO_DEBUG") == "1":
            raise
        message = " ".join(str(err).split())
        print(f"credo {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
