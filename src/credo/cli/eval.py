"""`credo eval`: the held-out (or validation) accuracy of a checkpoint (greedy; with --k, avg@k and pass@k)."""

from __future__ import annotations

import argparse
import json

from credo.cli.options import add_config_options, flag_values, show_config
from credo.core.config import ConfigError, load_config


def cmd_eval(args: argparse.Namespace) -> int:
    # the policy and the task load torch (~2 s): imported when the command runs, so that `credo --help` stays fast
    from credo.policy import bind_task, load_policy
    from credo.policy.device import autocast_dtype, resolve_device, resolve_dtype
    from credo.tasks import make_task
    from credo.train.evaluate import EvalConfig, evaluate
    from credo.train.starts import resolve_checkpoint
    known = {f for f in EvalConfig.__dataclass_fields__}
    for item in args.set:  # before EvalConfig, `eval --set` set task options
        key = item.split("=", 1)[0].strip()
        if "=" in item and key.split(".")[0] not in known:
            raise ConfigError(f"eval --set {item}: {key} is not an EvalConfig field; a task option is set as "
                              f"task_options.{key} (--set task_options.{item})")
    config = load_config(EvalConfig, args.config, args.set, prefix="eval.", flags=flag_values(args, {
        "checkpoint": "checkpoint", "task": "task", "n": "n", "k": "k", "max_new_tokens": "max_new_tokens",
        "seed": "seed", "device": "device", "split": "split"}))
    if args.help_config:
        return show_config(config, "eval")
    task = make_task(config.task, config.task_options, prefix="eval.task_options.")
    if config.split == "validation" and not hasattr(task, "validation_problems"):
        raise ConfigError(f"eval --split validation needs a task with a validation split (arith, arith-long, "
                          f"gym:<name>); task {task.name!r} has none")
    device = resolve_device(config.device, "eval.device")
    dtype = resolve_dtype(config.dtype, device, "eval.dtype")
    checkpoint = resolve_checkpoint(config.checkpoint, "eval.checkpoint", task=config.task, progress=not args.quiet)
    policy = bind_task(load_policy(checkpoint, device=device, dtype=dtype, autocast=autocast_dtype(config.dtype)),
                       task, check_as="eval.checkpoint", max_new_tokens=config.max_new_tokens)
    problems = task.validation_problems(config.n) if config.split == "validation" else task.heldout_problems(config.n)
    result = evaluate(policy, task, problems, k=config.k, max_new_tokens=config.max_new_tokens,
                      seed=config.seed, progress=not args.quiet)
    print(json.dumps({**result.as_dict(), "split": config.split}))
    print(f"accuracy={result.accuracy:.4f}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`credo eval` and its options."""
    p = sub.add_parser("eval", help="held-out accuracy of a checkpoint; the last line is accuracy=<float>")
    p.add_argument("--checkpoint", help="a credo checkpoint, a Hugging Face model directory, smollm2-135m or a "
                   "training run (its final/), sft:<preset> (default: the task's SFT start)")
    p.add_argument("--task", help="task name (default arith; arith-long, gym:<dataset>, jsonl:<path>); "
                   "the default --checkpoint is this task's SFT start")
    add_config_options(p, "EvalConfig", "--set task_options.digits=3")
    p.add_argument("--n", type=int, help="problems of the split (default 500)")
    p.add_argument("--split", choices=("heldout", "validation"),
                   help="heldout (default: the test set) or validation (where settings are chosen)")
    p.add_argument("--k", type=int, help="also report avg@k and pass@k from k samples at temperature 1 (default 0)")
    p.add_argument("--max-new-tokens", type=int, help="generation limit per completion (default 96)")
    p.add_argument("--seed", type=int, help="seed for the sampled (avg@k) completions (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_eval)
