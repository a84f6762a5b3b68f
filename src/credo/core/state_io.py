"""Pickle-free state on disk: tensors in safetensors, everything else in JSON, and sha256 manifests.

Nothing credo reads back from a run directory or the cache is unpickled: a shared run directory
must not be able to run code on the machine that resumes it. A state `name` is two files,
`name.safetensors` (tensors only; the format cannot carry code) and `name.json` (plain values).
A checkpoint directory also carries `manifest.json`, the sha256 of every other file, written last;
`verify_manifest` names the first file that is missing, extra or changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from credo.core.config import UserError
from credo.core.files import atomic_write_json

MANIFEST = "manifest.json"
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin")


class CorruptStateError(UserError):
    """A state file or checkpoint that does not verify or does not parse; the message names the file."""


def save_state(directory: str, name: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write `name.safetensors` and `name.json` into `directory` (which the caller renames into place)."""
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()},
              os.path.join(directory, name + ".safetensors"))
    with open(os.path.join(directory, name + ".json"), "w") as f:
        json.dump(meta, f)


def load_state(directory: str, name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """-> (tensors, meta) of state `name`; a file that does not parse is a CorruptStateError naming it."""
    tensor_path = os.path.join(directory, name + ".safetensors")
    meta_path = os.path.join(directory, name + ".json")
    try:
        tensors = load_file(tensor_path)
    except FileNotFoundError:
        raise CorruptStateError(f"{tensor_path} is missing") from None
    except (SafetensorError, OSError, ValueError) as err:
        raise CorruptStateError(f"{tensor_path} is not a valid safetensors file ({err})") from None
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise CorruptStateError(f"{meta_path} is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptStateError(f"{meta_path} is not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise CorruptStateError(f"{meta_path} must hold a JSON object")
    return tensors, meta


def optimizer_state(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """torch optimizer state_dict -> (tensors 'optimizer.<param>.<key>', JSON-able rest)."""
    tensors, scalars = {}, {}
    for param, values in state_dict["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{param}.{key}"] = value
            else:
                scalars[f"{param}.{key}"] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state_dict["param_groups"]]
    tuple_keys = sorted({k for g in state_dict["param_groups"] for k, v in g.items() if isinstance(v, tuple)})
    return tensors, {"param_groups": groups, "scalars": scalars, "tuple_keys": tuple_keys}


def optimizer_state_dict(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `optimizer_state`."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            param, key = name[len("optimizer."):].split(".", 1)
            state.setdefault(int(param), {})[key] = value
    for name, value in meta["scalars"].items():
        param, key = name.split(".", 1)
        state.setdefault(int(param), {})[key] = value
    groups = [{k: tuple(v) if k in meta["tuple_keys"] else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def python_rng_state(rng_state: tuple) -> list:
    """random.Random.getstate() -> JSON-able list."""
    version, internal, gauss = rng_state
    return [version, list(internal), gauss]


def python_rng_from(saved: list) -> tuple:
    version, internal, gauss = saved
    return (version, tuple(internal), gauss)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(directory: str) -> list[str]:
    out = []
    for root, _, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), directory)
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def write_manifest(directory: str) -> None:
    """sha256 of every file in `directory`, written atomically as the last file."""
    atomic_write_json(os.path.join(directory, MANIFEST),
                      {"sha256": {f: _sha256(os.path.join(directory, f)) for f in _files(directory)}})


def verify_manifest(directory: str) -> None:
    """Raise CorruptStateError naming the first file of `directory` that its manifest does not vouch for."""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            listed = json.load(f)["sha256"]
        if not isinstance(listed, dict):
            raise TypeError
    except FileNotFoundError:
        raise CorruptStateError(f"checkpoint {directory} has no {MANIFEST} (incomplete, or written by an older "
                                "credo); it cannot be verified, so it is not loaded") from None
    except (ValueError, KeyError, TypeError):
        raise CorruptStateError(f"{path} is not a valid manifest") from None
    present = _files(directory)
    for name in present:
        if name == "adapter_state.pt":  # credo's own LoRA adapters before 2026-12-02: still a pickle, not loaded
            raise CorruptStateError(f"{os.path.join(directory, name)} holds LoRA adapters as a pickle, written by an "
                                    "older credo; this one reads only adapter_state.safetensors and never loads a "
                                    "pickle (start a new run)")
        if name.endswith(PICKLE_SUFFIXES):
            raise CorruptStateError(f"{os.path.join(directory, name)} is a pickle file; credo never loads pickles "
                                    "from a run directory (start a new run, or replace this one with --force)")
        if name not in listed:
            raise CorruptStateError(f"{os.path.join(directory, name)} is not in the checkpoint's manifest")
    for name, digest in listed.items():
        file = os.path.join(directory, name)
        if name not in present:
            raise CorruptStateError(f"{file} is listed in the checkpoint's manifest but missing")
        if _sha256(file) != digest:
            raise CorruptStateError(f"{file} does not match its sha256 in {path} (changed or "
                                    "corrupted since it was saved)")


def check_safetensors(directory: str) -> None:
    """Every .safetensors file of `directory` must have a valid header; else a CorruptStateError naming it."""
    for name in _files(directory):
        if name.endswith(".safetensors"):
            path = os.path.join(directory, name)
            try:
                with safe_open(path, framework="pt") as f:
                    f.keys()
            except (SafetensorError, OSError, ValueError) as err:
                raise CorruptStateError(f"{path} is not a valid safetensors file ({err})") from None
