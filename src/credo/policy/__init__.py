"""Policy backends behind one interface: the tiny GPT (fast on CPU) and Hugging Face causal LMs."""

from __future__ import annotations

import functools
import os

import torch
from safetensors import SafetensorError

from credo.core.config import ConfigError, UserError
from credo.core.protocols import Policy, Samples, SamplingConfig  # noqa: F401
from credo.policy.base import read_policy_meta  # noqa: F401
from credo.policy.tiny import TinyPolicy  # noqa: F401
from credo.policy.locate import check_policy_path, check_task_fits  # noqa: F401
from credo.policy.adapters import LoraSettings, adapter_meta, load_adapter_policy, weights_digest
from credo.policy.hf import HFPolicy
from credo.policy.smollm import ALIASES, ensure_smollm2


def load_policy(path: str, device: str | torch.device = "cpu", lora: LoraSettings | None = None, seed: int = 0,
                dtype: torch.dtype = torch.float32, autocast: torch.dtype | None = None) -> "Policy":
    """A policy from a credo checkpoint (a saved LoRA adapter included: its base loaded, checked and the adapter
    applied), any Hugging Face model directory, or an alias (smollm2-135m), with its weights on `device`
    (credo.policy.device.resolve_device) in `dtype`, computing under torch.autocast in `autocast` when set
    (credo.policy.device.autocast_dtype; both a Hugging Face model's only). A saved adapter stays apart from its
    base (a command that scores reads it as it was trained); with `lora` (the caller trains) it is merged into its
    base, and with lora.r > 0 fresh adapters, drawn from `seed`, go on top: what trains is a plain model or those."""
    named = path
    if path in ALIASES:
        path = ensure_smollm2()
    if is_tiny_start(path):
        if lora is not None and lora.r:
            raise ConfigError(f"lora.r={lora.r}: LoRA needs a Hugging Face model; {path} is a tiny policy, "
                              "which trains in full (set lora.r=0)")
        if dtype != torch.float32 or autocast is not None:
            setting = "bfloat16-mixed" if autocast is not None else str(dtype).replace("torch.", "")
            raise ConfigError(f"dtype={setting}: {path} is a tiny policy, which runs float32 "
                              "(dtype is for a Hugging Face model)")
        return _checked_load(TinyPolicy.load, path, device)
    if adapter_meta(path) is not None:
        def base(directory: str) -> "Policy":
            return load_policy(directory, device, dtype=dtype, autocast=autocast)
        policy = _checked_load(lambda p, _: load_adapter_policy(p, base), path, device)
    elif os.path.isfile(os.path.join(path, "config.json")):
        policy = _checked_load(functools.partial(HFPolicy.load, dtype=dtype, autocast=autocast), path, device)
    else:
        raise FileNotFoundError(f"{path} is neither a credo checkpoint (policy.json) "
                                "nor a Hugging Face model (config.json)")
    if lora is not None:
        policy.merge_adapter()  # an adapter start trains as the full model it stands for
    if lora is not None and lora.r:
        policy.add_lora(lora, seed, base=(named if named in ALIASES else os.path.abspath(path), weights_digest(path)))
    return policy


def is_tiny_start(path: str) -> bool:
    """Whether `path` holds a tiny policy (which trains in full, float32): the test `load_policy` makes, and a
    command refusing LoRA before any work makes with it. An alias names a Hugging Face model."""
    return path not in ALIASES and read_policy_meta(path).get("backend") == "tiny"


def _checked_load(load, path: str, device: str) -> "Policy":
    """`load(path, device)`; a checkpoint whose files do not fit together (a missing key, a shape that differs
    from its config, a config transformers cannot read) is an error naming the directory, not a traceback."""
    try:
        return load(path, device)
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, OSError, SafetensorError) as err:
        first = " ".join(str(err).split())[:200]
        raise UserError(f"{path}: cannot load the checkpoint ({type(err).__name__}: {first})") from None


def bind_task(policy: "Policy", task: object, check_as: str = "", max_new_tokens: int = 0) -> "Policy":
    """Give the policy the task's system prompt (the answer format its verifier expects), unless it has one
    already (a saved chat checkpoint keeps its own). Only a chat backend renders it. With `check_as` (the
    field that named the policy), then refuse a policy that cannot encode the task's prompts, or whose context
    cannot hold one with `max_new_tokens` more (check_task_fits)."""
    task_system = getattr(task, "system_prompt", None)  # a task without one (arith) states none
    if task_system and not policy.system_prompt:
        policy.system_prompt = task_system
    if check_as:  # after the system prompt: it is part of every prompt's length
        check_task_fits(policy, task, check_as, max_new_tokens)
    return policy
