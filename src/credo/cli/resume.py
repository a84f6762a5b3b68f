"""What `credo train --resume` may change in a run's config (the steps, upwards; the device, when asked; the
trackers) and what it refuses; the run is planned once, as a new one is (credo.train.plan)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from credo.core.config import ConfigError, merge, to_dict
from credo.policy.device import device_name, resolve_device
from credo.train.config import TrainConfig, config_from_run, resume_differences, train_config_from_dict
from credo.train.plan import Plan, with_plan


def resume_config(args: argparse.Namespace, requested: dict) -> tuple[TrainConfig, Plan]:
    """The run's own config for `credo train --resume`, and its plan: only --steps (upwards), --device and the
    trackers may differ from its config.yaml; any other setting the command names (`requested`: every training
    field of --config, the flags and --set) is a one-line error."""
    if args.out and os.path.abspath(args.out) != os.path.abspath(args.resume):
        raise ConfigError(f"--resume continues {args.resume} in place; --out {args.out} names another directory")
    config = config_from_run(args.resume)
    if args.steps is not None:
        config = replace(config, steps=args.steps)  # extending a run is allowed (range-checked by TrainConfig)
    requested = dict(requested)
    device = requested.pop("device", None)  # moving a run to another device is allowed, when asked for
    if "report_to" in requested:  # where the run reports to may change: it is not what it trains
        config = train_config_from_dict(merge(to_dict(config), {"report_to": requested["report_to"]}))
    differences = resume_differences(config, requested)
    if differences:
        raise ConfigError(f"--resume {args.resume}: the command differs from the run's config.yaml: "
                          + "; ".join(differences) + " (drop those options, or start a new run with --out)")
    return with_plan(resume_device(config, device, args.resume))


def resume_device(config: TrainConfig, device: object, run_dir: str) -> TrainConfig:
    """The run's config on the device a resume continues on: the one config.yaml records, or `device` when the
    command names one (a move to another device is announced: its steps from here round differently)."""
    if device is None:
        try:
            resolve_device(config.device, "train.device")
        except ConfigError as err:
            raise ConfigError(f"{err} (--resume {run_dir} trained on {config.device}; pass --device cpu to continue "
                              "it on the CPU)") from None
        return config
    moved = replace(config, device=device)  # its format checked, naming train.device
    now = device_name(resolve_device(moved.device, "train.device"))
    if now != config.device:
        print(f"credo train: --resume {run_dir} trained on {config.device} and continues on {now}, as asked; its "
              f"steps from here are not bit-identical to a run that stayed on {config.device} (docs/gpu.md)",
              file=sys.stderr)
    return replace(config, device=now)
