"""What a run directory must satisfy before training continues in it, or starts in it again.

A checkpoint records the config it was trained with; a resume is refused when config.yaml has changed since
(but for fields that do not change training: `steps` may grow, `keep_checkpoints` and `final_eval_n` may
change, and `device` when the command names another one), when `--steps` would shorten the run, and
(credo.core.files.MetricsLog) when metrics.jsonl lost rows.
A checkpoint without that record (written before configs were recorded, or with the record removed) cannot be
checked, so it is refused unless the user accepts it (`--accept-unrecorded-checkpoint`). A run without a
checkpoint starts again from step 0 only when it cannot have had one: not when it finished or logged past the
first checkpoint's step (its checkpoints were removed).
"""

from __future__ import annotations

import os
from typing import Any

from credo.core.config import ConfigError, UserError, dump_yaml, to_dict
from credo.core.records import METRICS_FIELDS
from credo.core.files import atomic_write_text, last_checkpoint, read_jsonl
from credo.core.outputs import claim_output, holds_only_own_files, is_locked
from credo.core.state_io import CorruptStateError
from credo.train.config import TrainConfig, as_recorded, comparable_config, config_from_run


# fields a resume may change in config.yaml: none of them changes what training does (report_to: where it is
# reported)
MAY_CHANGE = ("steps", "keep_checkpoints", "final_eval_n", "report_to")
# and the device, when the command asks for another one explicitly (`--device`): the same computation, whose
# floating-point rounding differs across devices (the CLI warns; docs/gpu.md)
MAY_MOVE = ("device",)


def config_changes(saved: dict[str, Any] | None, config: TrainConfig) -> list[str]:
    """The fields (but MAY_CHANGE) whose value in `config` differs from `saved`, the config a checkpoint
    recorded (None: a checkpoint from before configs were recorded, nothing to compare). A field only one
    side has (one added to TrainConfig since) is not a difference."""
    if saved is None:
        return []
    saved = {**saved, "credit": as_recorded(str(saved.get("method", "")), dict(saved.get("credit") or {}))}
    old, new = comparable_config(saved), comparable_config(to_dict(config))
    return [f"train.{k}: checkpoint {old[k]!r}, now {new[k]!r}" for k in sorted(set(old) & set(new))
            if k not in MAY_CHANGE + MAY_MOVE and old[k] != new[k]]


ACCEPT_UNRECORDED = "--accept-unrecorded-checkpoint"
"""The `credo train` flag that resumes a checkpoint holding no record of its config, unchecked."""


def check_resumable(state: dict[str, Any], config: TrainConfig, step: int, checkpoint: str,
                    accept_unrecorded: bool = False) -> None:
    """Refuse to continue from `checkpoint` (its trainer state `state`, at `step`) with `config` when the
    config changed since the checkpoint was written, or its steps end before `step`; and, unless
    `accept_unrecorded`, when the checkpoint holds no record of its config (nothing to check against)."""
    if state.get("config") is None and not accept_unrecorded:
        run_dir = os.path.dirname(os.path.dirname(os.path.abspath(checkpoint)))
        raise CorruptStateError(
            f"{os.path.join(checkpoint, 'trainer_state.json')} holds no record of the config it was trained with "
            "(written by an older credo, or the record was removed), so config.yaml cannot be checked against it; "
            f"to resume it unchecked, pass {ACCEPT_UNRECORDED} (credo train --resume {run_dir} {ACCEPT_UNRECORDED})")
    changed = config_changes(state.get("config"), config)
    if changed:
        raise CorruptStateError(f"the config differs from the one checkpoint {checkpoint} was trained with "
                                f"({'; '.join(changed)}); on resume only {', '.join('train.' + f for f in MAY_CHANGE)} "
                                "may change (restore config.yaml, or start a new run)")
    recorded = (state.get("config") or {}).get("steps", step)
    if config.steps < max(step, recorded):
        raise ConfigError(f"train.steps={config.steps} is below the {max(step, recorded)} steps the run was "
                          f"trained towards (its last checkpoint is at step {step}); --steps can only extend a run")


def check_restartable(run_dir: str, config: TrainConfig) -> None:
    """Refuse to start `run_dir` again from step 0 when it must have had a checkpoint (it finished, or its
    metrics log passed the first checkpoint's step): its checkpoints were removed, and a restart would
    overwrite what is left of it."""
    if os.path.exists(os.path.join(run_dir, "summary.json")) or os.path.isdir(os.path.join(run_dir, "final")):
        raise CorruptStateError(f"{run_dir} finished, but its checkpoints/ is missing: nothing to resume from "
                                "(start a new run with --out)")
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"), drop_torn_tail=True, fields=METRICS_FIELDS)
    last = max((int(r.get("step", 0)) for r in rows), default=0)
    if last > config.checkpoint_every:  # step checkpoint_every's checkpoint was written before step +1 was logged
        raise CorruptStateError(f"{run_dir}: metrics.jsonl reaches step {last}, past the checkpoint of step "
                                f"{config.checkpoint_every}, but checkpoints/ holds none: nothing to resume from "
                                "(start a new run with --out)")


def claim_run(run_dir: str, force: bool, inputs: tuple[str, ...], config: TrainConfig) -> bool:
    """Claim `credo train --out` for a new run; True if it holds an earlier run with nothing worth keeping: one
    that never reached a checkpoint (not one whose checkpoints were removed), is not running, and holds no
    file credo did not write."""
    if not claim_output(run_dir, "train", force=force, inputs=inputs):
        return False
    if last_checkpoint(run_dir) is not None or os.path.exists(os.path.join(run_dir, "final")):
        raise ConfigError(f"{run_dir} already holds a run; continue it with --resume {run_dir}, or replace it with "
                          "--force")
    if is_locked(run_dir):
        raise ConfigError(f"{run_dir} holds a run that another credo process is training; nothing was touched")
    if not holds_only_own_files(run_dir, "train"):
        raise ConfigError(f"{run_dir} holds a run that never reached a checkpoint, and files credo did not write; "
                          "nothing was touched (choose another --out, or pass --force to replace it all)")
    try:  # the earlier run's own checkpoint_every says when it must have written a checkpoint
        earlier = config_from_run(run_dir)
    except (UserError, ValueError):
        earlier = config
    check_restartable(run_dir, earlier)  # a run whose checkpoints were removed is not "nothing worth keeping"
    return True


def update_config_yaml(path: str, config: TrainConfig) -> None:
    """Rewrite config.yaml (atomically) when it no longer describes the run: a run extended with --steps."""
    text = dump_yaml(config)
    with open(path) as f:
        if f.read() == text:
            return
    atomic_write_text(path, text)
