"""`credo`: one subcommand per module of this package (methods, sft, train, audit, merge, compare, show, eval); this
module builds the parser from them and runs the one named, a user's error as one line.

Every command is configured the same way: a frozen dataclass (TrainConfig, SFTConfig, EvalConfig,
AuditConfig, CompareConfig, ShowConfig) loaded from defaults <- `--config FILE.yaml` <- the command's
shortcut flags (sugar for its fields) <- `--set key=value` (repeatable; dotted keys for nested fields,
`--set loss.eps_high=0.28`). `--help-config` lists every field with its doc and value; `--help` the flags.
A command's module imports what loads torch when the command runs, so that `credo --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from credo.cli import audit, compare, merge, methods, sft, show, train
from credo.cli import eval as eval_command
from credo.cli.options import check_overrides
from credo.core.config import UserError
from credo.core.disk_errors import as_disk_error, is_disk_error
from credo.core.terminal import escape_controls
from credo.train.interrupts import Interrupted, signals_raise

COMMANDS = (methods, sft, train, audit, merge, compare, show, eval_command)
"""The subcommands' modules, in the order `credo --help` lists them; each has `add_parser(sub)`."""

STOPPABLE = ("train", "compare", "sft")
"""The commands a signal stops in one line (credo.train.interrupts): the long-running ones, which can go on."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="credo", description="Credit assignment for RL with verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _threads() -> None:
    import torch  # ~2 s to load: after the arguments parse, so that `--help` and a usage error stay fast
    # CPU runs are fastest with one intra-op thread per physical core; respect an explicit setting.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, min(os.cpu_count() or 1, 8)))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in run directories
    _threads()
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
        if not is_disk_error(err) or os.environ.get("CREDO_DEBUG") == "1":
            raise
        return _one_line_error(args.command, str(as_disk_error(err)))


def _one_line_error(command: str, message: str) -> int:
    # a path or value from the user or a data file may hold terminal escapes
    print(f"credo {command}: error: {escape_controls(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
