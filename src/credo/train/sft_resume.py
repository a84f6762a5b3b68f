"""The part-way state of a Hugging Face SFT (credo.train.sft_hf), so that a stopped `credo sft --start ...` goes on
from its last validation check when the same command runs again, and ends with the start an unbroken run writes.

OUT/resume holds it while the SFT runs: rewritten atomically at a validation check (at most every
SAVE_EVERY_SECONDS of training, and at the first), its manifest verified
before it is read. The finished start replaces OUT, and the state with it. Pickle-free (credo.core.state_io): the
trained weights (a LoRA policy's adapters alone), the best check's weights where they differ, AdamW's moments,
and the random streams the SFT draws from (its problem generator, its example-kind draws, torch's global stream
and, on a GPU, the device's, for dropout)."""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from typing import Any

import torch

from credo.core.config import ConfigError, to_dict
from credo.core.files import atomic_directory
from credo.core.state_io import (CorruptStateError, load_state, optimizer_state, optimizer_state_dict,
                                 python_rng_from, python_rng_state, save_state, verify_manifest, write_manifest)
from credo.policy.adapters import is_lora

RESUME_DIR = "resume"
STATE = "sft_state"
SAVE_EVERY_SECONDS = 300.0
"""The least training time between two saves: a full-weight start's state (weights, the best check's, AdamW's two
moments) is several times the model, too much to write at every check of a quick SFT; an adapter's is small, and a
long SFT's checks are further apart than this anyway."""


@dataclass
class Progress:
    """Where an SFT stands after a validation check."""

    step: int
    """Optimiser steps taken."""
    history: list[dict]
    """The validation checks so far (metrics.jsonl's rows)."""
    best: tuple[float, int, dict[str, torch.Tensor]]
    """(validation accuracy, step, weights) of the check the start will hold (sft.keep)."""
    seconds: float
    """Training time so far."""


def trained_weights(policy: Any) -> dict[str, torch.Tensor]:
    """A copy of the weights that train: every one, or a LoRA policy's adapters alone (the base never changes)."""
    lora = is_lora(policy.model)
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items() if not lora or "lora_" in k}


def save_progress(out_dir: str, config: Any, policy: Any, optimizer: torch.optim.Optimizer,
                  generator: torch.Generator, rng: random.Random, progress: Progress) -> None:
    """OUT/resume, atomically: everything the SFT needs to go on from `progress` as if it had not stopped."""
    with atomic_directory(os.path.join(out_dir, RESUME_DIR)) as tmp:
        moments, optimizer_meta = optimizer_state(optimizer.state_dict())
        accuracy, best_step, best = progress.best
        tensors = {**moments, **{f"weights.{k}": v for k, v in trained_weights(policy).items()},
                   **({f"best.{k}": v for k, v in best.items()} if best_step != progress.step else {}),
                   "rng.generator": generator.get_state(), "rng.torch": torch.get_rng_state(),
                   **({"rng.cuda": torch.cuda.get_rng_state(policy.device)} if _on_cuda(policy) else {})}
        save_state(tmp, STATE, tensors, {
            "step": progress.step, "history": progress.history, "best": [accuracy, best_step],
            "seconds": progress.seconds, "rng": python_rng_state(rng.getstate()), "optimizer": optimizer_meta,
            "config": to_dict(config)})
        write_manifest(tmp)


def load_progress(out_dir: str, config: Any, policy: Any, optimizer: torch.optim.Optimizer,
                  generator: torch.Generator, rng: random.Random) -> Progress | None:
    """The state OUT/resume holds, loaded into the policy, the optimiser and the random streams; None where there
    is none. A state of other settings, or one that does not verify, is one line naming it."""
    path = os.path.join(out_dir, RESUME_DIR)
    if not os.path.isdir(path):
        return None
    try:
        verify_manifest(path)
        tensors, meta = load_state(path, STATE)
    except CorruptStateError as err:
        raise CorruptStateError(f"{err}: the part-way SFT cannot go on (--retrain trains from the start)") from None
    recorded, given = meta.get("config") or {}, to_dict(config)
    if recorded != given:
        changed = sorted(k for k in set(recorded) | set(given) if recorded.get(k) != given.get(k))
        raise ConfigError(f"{path} holds a part-way SFT with other settings (sft.{', sft.'.join(changed)}): give "
                          "the same settings to go on from it, or pass --retrain to train from the start")
    try:
        weights = {k[len("weights."):]: v for k, v in tensors.items() if k.startswith("weights.")}
        policy.model.load_state_dict(weights, strict=not is_lora(policy.model))
        optimizer.load_state_dict(optimizer_state_dict(tensors, meta["optimizer"]))
        generator.set_state(tensors["rng.generator"])
        torch.set_rng_state(tensors["rng.torch"])
        if _on_cuda(policy):  # dropout on a GPU draws from the device's own stream
            torch.cuda.set_rng_state(tensors["rng.cuda"], policy.device)
        rng.setstate(python_rng_from(meta["rng"]))
        step, (accuracy, best_step) = int(meta["step"]), meta["best"]
        best = ({k[len("best."):]: v for k, v in tensors.items() if k.startswith("best.")} if best_step != step
                else trained_weights(policy))
        return Progress(step, list(meta["history"]), (float(accuracy), int(best_step), best), float(meta["seconds"]))
    except (KeyError, ValueError, TypeError, RuntimeError) as err:
        raise CorruptStateError(f"{path} does not fit this SFT ({type(err).__name__}: {str(err)[:300]}); "
                                "--retrain trains from the start") from None


def _on_cuda(policy: Any) -> bool:
    return torch.device(policy.device).type == "cuda"


def discard(out_dir: str) -> None:
    """Removes the part-way state OUT/resume (this module's own folder, in an output the SFT claimed): an SFT told
    to train from the start must not leave it for a later run to go on from."""
    shutil.rmtree(os.path.join(out_dir, RESUME_DIR), ignore_errors=True)


def saved_step(path: str) -> int | None:
    """The step a part-way state in `path` holds, read from its JSON alone (None where there is none or it does not
    read): what a stopped SFT tells its user."""
    try:
        with open(os.path.join(path, STATE + ".json")) as f:
            step = json.load(f).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None
