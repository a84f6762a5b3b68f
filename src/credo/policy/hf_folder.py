"""What credo refuses in a Hugging Face model folder before transformers reads it: pickled weights (unpickling can
run code) and an `auto_map` naming the folder's own Python (transformers would import it). Each is one line naming
the file; no model folder makes credo run code (docs/trust.md)."""

from __future__ import annotations

import json
import os

from credo.core.config import UserError


def refuse_pickled_weights(path: str, field: str = "") -> None:
    """A model directory whose weights are only pickled (pytorch_model*.bin, no *.safetensors) is one line
    saying to convert them: credo reads no pickle from disk (unpickling can run code), whatever transformers
    would do with it (its restricted loader, or a traceback when the pickle holds more than tensors)."""
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    pickled = [n for n in names if n.startswith("pytorch_model") and n.endswith((".bin", ".bin.index.json"))]
    if pickled and not any(n.endswith(".safetensors") for n in names):
        where = f"{field}={path!r}: " if field else ""
        raise UserError(f"{where}{os.path.join(path, pickled[0])} holds pickled PyTorch weights, which credo does "
                        "not load (a pickle can run code); convert them to safetensors (load the model with "
                        "transformers where you trust the file, then save_pretrained it) and use that directory")


CODE_NAMING_FILES = ("config.json", "tokenizer_config.json")
"""The files of a Hugging Face model directory whose `auto_map` names Python modules in the directory."""


def refuse_custom_code(path: str, field: str = "") -> None:
    """A model directory whose config.json or tokenizer_config.json has an `auto_map` (classes in the folder's own
    Python, which transformers imports, after asking on stdin) is one line naming the file: no model folder makes
    credo run code. Loading passes trust_remote_code=False as well, so nothing can prompt even if a file changes
    between this check and the load."""
    for name in CODE_NAMING_FILES:
        file = os.path.join(path, name)
        try:
            with open(file, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):  # absent, or unreadable: transformers' own load names it
            continue
        if isinstance(data, dict) and "auto_map" in data:
            where = f"{field}={path!r}: " if field else ""
            raise UserError(f"{where}{file} has an auto_map naming Python code of the model folder's own, which "
                            "credo never runs; use a model whose architecture transformers ships")
