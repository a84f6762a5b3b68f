"""What a command's `--start` or `--checkpoint` names, resolved to a policy directory: the task's SFT start (built or
fetched by credo.train.sft), a named SFT start `sft:<preset>`, an alias's cached Hugging Face copy, a run directory's
final/ policy, or a path, checked (credo.policy.locate) before the command claims its --out."""

from __future__ import annotations

import os

from credo.policy.locate import check_policy_path, is_policy
from credo.policy.smollm import ALIASES, ensure_smollm2
from credo.train.sft import ensure_sft
from credo.train.sft_config import check_preset, sft_config_for

DEFAULT_START = ("", "sft")
"""Names of the task's SFT start (built or fetched by credo.train.sft.ensure_sft)."""
NAMED_START = "sft:"
"""Prefix of a named SFT start: sft:<preset> (credo.train.sft_config.SFT_PRESETS, e.g. sft:arith-long-skilled)."""


def resolve_checkpoint(path: str, field: str, task: str = "arith", progress: bool = True) -> str:
    """The policy directory `path` names, checked: '' or 'sft' is the task's SFT start, an alias
    (smollm2-135m) its cached Hugging Face copy, 'sft:<preset>' a named SFT start (named_start), a run directory
    its final/ policy, anything else itself."""
    if path in DEFAULT_START:
        path = ensure_sft(progress=progress, task=task)
    elif path.startswith(NAMED_START):
        path = named_start(path, field, task, progress)
    elif path in ALIASES:
        path = ensure_smollm2()
    elif not is_policy(path) and os.path.isdir(os.path.join(path, "final")):
        path = os.path.join(path, "final")  # a training run: its final policy
    return check_policy_path(path, field)


def named_start(name: str, field: str, task: str, progress: bool = True) -> str:
    """The directory of the named SFT start `sft:<preset>` (e.g. sft:arith-long-skilled), built or fetched by
    credo.train.sft.ensure_sft; refused, naming `field`, when no preset has that name or it is another task's."""
    preset = name[len(NAMED_START):]
    check_preset(preset, task, field)
    return ensure_sft(sft_config_for(preset), progress=progress)
