"""LoRA adapters (peft) of a Hugging Face policy: their settings, the adapter-only directory, its base checked.

A LoRA policy is saved as its adapter alone: `adapter_model.safetensors` and `adapter_config.json` (peft's own
file names and format, so `peft.PeftModel.from_pretrained(base, directory)` reads it too) and `policy.json`,
whose `adapter` entry names the base model (`base`: an alias such as smollm2-135m, or an absolute path) and the
sha256 of the base's weight files (`base_digest`). Loading reads the base, refuses it when its digest differs
(one line naming the base's files), and applies the adapter; the tokenizer is the base's. A base may itself be
an adapter directory (an adapter trained from an adapter start): that chain is loaded, merged into plain
weights, and the adapter goes on top, so the start an adapter was trained from is exactly what it modifies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from safetensors.torch import load_file, save_file

from credo.core.config import MAX_LORA_RANK, UserError, check, check_in
from credo.core.files import atomic_directory, atomic_write_json
from credo.core.state_io import CorruptStateError
from credo.policy.base import read_policy_meta
from credo.policy.smollm import ALIASES, ensure_smollm2

ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""The adapter's weights in a saved LoRA policy (peft's file name)."""
ADAPTER_CONFIG = "adapter_config.json"
"""The adapter's peft LoraConfig in a saved LoRA policy (peft's file name; JSON)."""
ALL_LINEAR = "all-linear"
"""peft's name for every linear layer but the output head: in a Llama, q/k/v/o_proj and gate/up/down_proj."""
LORA_SEED_OFFSET = 7_919
"""Offset from the run's seed of the seed that draws the adapters' initial weights (LoRA's A matrices) and,
with lora.dropout > 0, each update's dropout masks: a run's seed fixes them without touching its other streams."""


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters instead of full-weight training (Hugging Face models; peft's LoraConfig)."""

    r: int = 0
    """Rank of the adapters; 0 (the default) is off: every weight trains, exactly as without this section. > 0
    trains the adapters only, and the run's checkpoints and final/ hold the adapter alone (a few MB) with the
    base model named and its digest checked on load."""
    alpha: int = 16
    """LoRA scaling numerator: the adapter's update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (0: none). Its masks come from the run's seed and step, so a
    resumed run stays bit-identical."""
    target_modules: tuple[str, ...] = (ALL_LINEAR,)
    """Module names that get adapters; 'all-linear' (the default) is every linear layer of the attention and the
    MLP, not the output head."""

    def __post_init__(self) -> None:
        check_in(self.r, 0, MAX_LORA_RANK, "lora.r")
        check(self.alpha > 0, f"lora.alpha must be > 0, got {self.alpha}")
        check(0 <= self.dropout < 1, f"lora.dropout must be in [0, 1), got {self.dropout}")
        check(len(self.target_modules) > 0 and all(self.target_modules),
              f"lora.target_modules must name at least one module, got {list(self.target_modules)}")
        check(ALL_LINEAR not in self.target_modules or len(self.target_modules) == 1,
              f"lora.target_modules: '{ALL_LINEAR}' stands alone (it already names every linear layer), got "
              f"{list(self.target_modules)}")


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` is wrapped with peft adapters (peft is not imported for it: no peft model exists before)."""
    if "peft" not in sys.modules:
        return False
    from peft import PeftModel
    return isinstance(model, PeftModel)


def wrap_with_lora(model: torch.nn.Module, settings: LoraSettings, seed: int = 0) -> torch.nn.Module:
    """`model` wrapped with fresh peft LoRA adapters (only they keep requires_grad). Their initial weights are
    drawn from `seed` in a forked RNG: the same seed gives the same adapters, and the global RNG is untouched."""
    from peft import LoraConfig, get_peft_model
    targets = ALL_LINEAR if settings.target_modules == (ALL_LINEAR,) else list(settings.target_modules)
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=targets, task_type="CAUSAL_LM")
    training = model.training
    with seeded_rng(seed + LORA_SEED_OFFSET, model), warnings.catch_warnings():
        # peft asks the model `is_gradient_checkpointing`, which transformers 5 renamed: its notice is peft's
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        try:
            wrapped = get_peft_model(model, config)
        except ValueError as err:  # e.g. a target module the model does not have
            raise UserError(f"lora.target_modules={list(settings.target_modules)}: peft cannot place adapters "
                            f"({' '.join(str(err).split())[:200]})") from None
    # the new adapter modules are built in training mode: the model's own mode for all (no dropout while scoring)
    return wrapped.train(training)


@contextlib.contextmanager
def seeded_rng(seed: int, model: torch.nn.Module) -> Iterator[None]:
    """The global torch RNG (and the model's CUDA device's) seeded with `seed` inside, restored after."""
    device = next(model.parameters()).device
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def weights_digest(directory: str) -> str:
    """'sha256:<hex>' of a model directory's weight files (model*.safetensors, or an adapter's weights), by name
    and content in name order: what identifies the base an adapter was trained on (config.json and the tokenizer
    files are left out: a save by another transformers version rewrites them, not the weights)."""
    names = sorted(n for n in os.listdir(directory) if n == ADAPTER_WEIGHTS
                   or (n.startswith("model") and n.endswith(".safetensors")))
    if not names:
        raise UserError(f"{directory} holds no model*.safetensors or {ADAPTER_WEIGHTS}: nothing to identify it by")
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(os.path.join(directory, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def adapter_meta(directory: str) -> dict[str, str] | None:
    """policy.json's `adapter` entry ({'base', 'base_digest'}) of a saved LoRA policy; None for a full one."""
    meta = read_policy_meta(directory).get("adapter")
    if meta is None:
        return None
    where = os.path.join(directory, "policy.json")
    if not (isinstance(meta, dict) and isinstance(meta.get("base"), str) and isinstance(meta.get("base_digest"), str)):
        raise CorruptStateError(f"{where}: `adapter` must hold the strings base and base_digest; the checkpoint is "
                                "corrupt")
    return meta


def base_directory(name: str) -> str:
    """The directory of the base an adapter names: an alias's cached copy, or the path itself."""
    return ensure_smollm2() if name in ALIASES else name


def check_base(directory: str, meta: dict[str, str]) -> str:
    """The base directory of the adapter saved in `directory`, after checking that its weights are the ones the
    adapter was trained on; else one line naming the adapter's policy.json and the base."""
    where = os.path.join(directory, "policy.json")
    base = base_directory(meta["base"])
    if not os.path.isdir(base):
        raise UserError(f"{where}: the adapter's base model {meta['base']} is not there; put it back (or merge the "
                        "adapter into full weights where it is: credo merge)")
    found = weights_digest(base)
    if found != meta["base_digest"]:
        raise UserError(f"{where}: the adapter was trained on base {meta['base']} with weights "
                        f"{meta['base_digest'][:19]}..., but {base}'s weights are {found[:19]}...: another model, "
                        "or changed since")
    return base


def save_adapter(model: torch.nn.Module, directory: str) -> None:
    """The adapter of peft model `model` into `directory`: its weights (safetensors, never a pickle) and its
    LoraConfig (JSON)."""
    from peft import get_peft_model_state_dict
    tensors = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(tensors, os.path.join(directory, ADAPTER_WEIGHTS))
    config = model.peft_config["default"].to_dict()
    config = {k: (sorted(v) if isinstance(v, (set, frozenset)) else v) for k, v in config.items()}
    with open(os.path.join(directory, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True, default=str)


def saved_settings(directory: str) -> LoraSettings:
    """The LoraSettings of the adapter saved in `directory` (its adapter_config.json)."""
    path = os.path.join(directory, ADAPTER_CONFIG)
    try:
        with open(path) as f:
            config = json.load(f)
        targets = config["target_modules"]
        targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
        return LoraSettings(r=int(config["r"]), alpha=config["lora_alpha"],
                            dropout=float(config.get("lora_dropout", 0.0)), target_modules=targets)
    except FileNotFoundError:
        raise CorruptStateError(f"{path} is missing; the adapter cannot be loaded") from None
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptStateError(f"{path} is not a LoRA adapter config ({type(err).__name__}: {err})") from None


def load_adapter_weights(model: torch.nn.Module, directory: str) -> None:
    """Set peft model `model`'s adapter weights from `directory`; every adapter weight must be in the file."""
    from peft import set_peft_model_state_dict
    path = os.path.join(directory, ADAPTER_WEIGHTS)
    if not os.path.exists(path):
        raise CorruptStateError(f"{directory} has no {ADAPTER_WEIGHTS} (LoRA adapter weights); it cannot be loaded")
    tensors = load_file(path)
    wanted = {k for k, _ in model.named_parameters() if "lora_" in k}
    result = set_peft_model_state_dict(model, tensors)
    missing = sorted(k for k in getattr(result, "missing_keys", []) if k in wanted)
    if missing or getattr(result, "unexpected_keys", []):
        raise CorruptStateError(f"{path} does not fit this model's adapters (missing {missing[:2]}, unexpected "
                                f"{list(getattr(result, 'unexpected_keys', []))[:2]})")


def load_adapter_policy(directory: str, load_base: Callable[[str], Any]) -> Any:
    """The HFPolicy saved as an adapter in `directory`: `load_base(base directory)` (credo.policy.load_policy, so a
    base that is itself an adapter loads as one), merged into plain weights, with this adapter applied on top."""
    meta = adapter_meta(directory)
    settings = saved_settings(directory)
    policy = load_base(check_base(directory, meta))
    policy.merge_adapter()
    policy.add_lora(settings, base=(meta["base"], meta["base_digest"]))
    load_adapter_weights(policy.model, directory)
    own = read_policy_meta(directory)
    policy.chat = bool(own.get("chat", policy.chat)) and bool(getattr(policy.tokenizer, "chat_template", None))
    policy.system_prompt = own.get("system_prompt")
    return policy


class AdapterDisabled:
    """The base of a LoRA policy, for the KL term's reference: its scores are the policy's with the adapters
    switched off (peft's `disable_adapter`), on the very same weights; no second copy of the model."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def score(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """policy.score(...) with the adapters off: (logprobs[B, T], entropy[B, T] or None)."""
        with self.policy.model.disable_adapter():
            return self.policy.score(*args, **kwargs)


STORED_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes a compacted adapter's weights may be stored in (compact_adapter): half float32's bytes."""


def compact_adapter(directory: str, out: str, dtype: str = "bfloat16") -> dict[str, Any]:
    """A copy at `out` (a new directory) of the adapter saved in `directory`, its weights stored in `dtype`
    (STORED_DTYPES): a start small enough to commit. What loads is the weights rounded to `dtype`, cast back to
    the model's on load; policy.json says so (`adapter.stored_dtype`), every other file is copied as it is. A
    start, not a checkpoint to resume (a resume needs its float32 state). -> {'adapter', 'out', 'dtype',
    'bytes_before', 'bytes_after', 'max_rounding'}."""
    check(dtype in STORED_DTYPES, f"compact_adapter.dtype must be one of {', '.join(STORED_DTYPES)}, got {dtype!r}")
    meta = adapter_meta(directory)
    if meta is None:
        raise UserError(f"{directory} is not a LoRA adapter (its policy.json names no base): nothing to compact")
    if os.path.exists(out):
        raise UserError(f"{out} exists; compact_adapter writes a new directory and overwrites nothing")
    source = os.path.join(directory, ADAPTER_WEIGHTS)
    tensors = load_file(source)
    stored = {k: v.to(STORED_DTYPES[dtype]).contiguous() for k, v in tensors.items()}
    rounding = max((float((v.float() - tensors[k].float()).abs().max()) for k, v in stored.items()), default=0.0)
    with atomic_directory(out) as tmp:
        for name in sorted(os.listdir(directory)):
            if name not in (ADAPTER_WEIGHTS, "policy.json") and os.path.isfile(os.path.join(directory, name)):
                shutil.copy2(os.path.join(directory, name), os.path.join(tmp, name))
        save_file(stored, os.path.join(tmp, ADAPTER_WEIGHTS))
        policy = read_policy_meta(directory)
        policy["adapter"] = {**meta, "stored_dtype": dtype}
        atomic_write_json(os.path.join(tmp, "policy.json"), policy)
    return {"adapter": directory, "out": out, "dtype": dtype, "bytes_before": os.path.getsize(source),
            "bytes_after": os.path.getsize(os.path.join(out, ADAPTER_WEIGHTS)), "max_rounding": rounding}


def merge_adapter(directory: str, out: str, load: Callable[[str], Any]) -> dict[str, Any]:
    """Write the full weights of the adapter in `directory` (its base with the adapter merged in) to `out`, a
    credo Hugging Face checkpoint any command or transformers loads; -> what was written."""
    if adapter_meta(directory) is None:
        raise UserError(f"{directory} is not a LoRA adapter (its policy.json names no base); it holds full weights "
                        "already")
    policy = load(directory)
    base = adapter_meta(directory)["base"]
    policy.merge_adapter()
    policy.save(out)
    return {"adapter": directory, "base": base, "out": out,
            "parameters": sum(p.numel() for p in policy.model.parameters())}
