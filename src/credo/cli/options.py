"""What every `credo` command shares in configuring itself: --config, --set, --help-config, flags as sugar.

A command's settings are one frozen dataclass, loaded by `credo.core.config.load_config` from defaults <- the
--config YAML file <- the shortcut flags the user gave (`flag_values`, `csv_flags`) <- --set overrides.
"""

from __future__ import annotations

import argparse
from typing import Any

from credo.core.config import ConfigError, help_config


def add_config_options(p: argparse.ArgumentParser, config_name: str, set_example: str) -> None:
    """--config, --set and --help-config: how every command is configured (see the module docstring)."""
    p.add_argument("--config", help=f"YAML file of {config_name} fields (flags and --set override it)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a field of {config_name}, e.g. {set_example} (repeatable)")
    p.add_argument("--device", help="where the model runs: auto (default: CUDA when torch finds a GPU, else the "
                   "CPU), cpu, cuda or cuda:N; the same as --set device=... (docs/gpu.md)")
    p.add_argument("--help-config", action="store_true",
                   help=f"list every {config_name} field with its doc and its value after --config, the flags "
                        "and --set, then exit")
    p.set_defaults(set_example=set_example.split()[1])  # the command's own KEY=VALUE, for check_overrides


def check_overrides(args: argparse.Namespace) -> None:
    """Every --set is KEY=VALUE; one that is not is one line whose example is the command's own (a field of
    its config, as its --help shows: `train.lr=1e-5` would name a field `train` of TrainConfig)."""
    for item in getattr(args, "set", None) or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. --set {args.set_example})")


def flag_values(args: argparse.Namespace, names: dict[str, str]) -> dict:
    """{field: value} of the shortcut flags the user gave ({flag attribute: field}); unset flags are None."""
    return {field: getattr(args, attr) for attr, field in names.items() if getattr(args, attr) is not None}


def show_config(config: Any, command: str) -> int:
    """Print `--help-config`'s listing of `config`; the command's exit status (0)."""
    print(help_config(config, f"credo {command}: {type(config).__name__} (--set KEY=VALUE, or a --config YAML file)"))
    return 0


def require_out(args: argparse.Namespace) -> str:
    """--out, which every command but `methods` needs (unless it only lists its config)."""
    if not args.out:
        raise ConfigError("--out DIR is required")
    return args.out


def add_force_option(parser: argparse.ArgumentParser, replaces: str) -> None:
    """`--force` as every command that writes an --out has it (credo.core.outputs.replace_refusal says what it
    refuses)."""
    parser.add_argument("--force", action="store_true", help=f"replace a non-empty --out that holds {replaces}; "
                        "never a folder holding files credo did not write, the home directory, one holding the "
                        "current directory, an input or the cache, nor a mount point")


def csv_flags(args: argparse.Namespace, *names: str) -> dict:
    """{name: [items]} of the comma-separated flags the user gave (e.g. --methods grpo,rredcot)."""
    return {n: [m for m in getattr(args, n).split(",") if m] for n in names if getattr(args, n) is not None}


def input_paths(config_file: str | None, start: str = "", task: str = "") -> tuple[str, ...]:
    """The files a command reads that `--out --force` must never delete: its --config file, its start or
    checkpoint directory and a jsonl:<path> task's data (credo.core.outputs.claim_output refuses to replace them)."""
    data = task[len("jsonl:"):] if task.startswith("jsonl:") else ""
    return tuple(p for p in (config_file, start, data) if p)
