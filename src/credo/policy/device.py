"""Where a command's model runs: the `device` and `dtype` settings of every command's config.

`device` is 'auto' (CUDA when torch says it is available, else the CPU), 'cpu', 'cuda' (the current CUDA
device) or 'cuda:N'; `dtype` is 'float32' (the default), 'bfloat16' (a Hugging Face model's weights in
bfloat16, on a GPU) or 'bfloat16-mixed' (a Hugging Face model's weights and optimiser state in float32, its
matrix products in bfloat16 under torch.autocast: on a CPU with AMX or AVX512-BF16 about 1.5x as fast; on one
without them, such as an AVX2-only CPU, torch falls back to slow bfloat16 kernels, over 10x slower than float32,
and a warning says so).
The format is checked when a config loads (`check_device_fields`, naming the field); whether the machine has
that device is checked when a command starts (`resolve_device`), so `--help-config` and a config file written on
one machine load on another. Random draws stay on credo's seeded CPU generators whatever the device (docs/gpu.md
says what is bit-identical across devices).
"""

from __future__ import annotations

import re
import warnings

import torch

from credo.core.config import ConfigError, check

DEVICE_PATTERN = re.compile(r"(auto|cpu|cuda(:(0|[1-9][0-9]{0,3}))?)")
"""auto, cpu, cuda or cuda:N with N in 0..9999 (no sign, no leading zero)."""
MIXED = "bfloat16-mixed"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, MIXED: torch.float32}
"""The weights' dtype of each `dtype` a command may ask for, by name."""
AUTOCAST = {MIXED: torch.bfloat16}
"""The dtype of the matrix products torch.autocast runs in, for a `dtype` that computes in lower precision than
its weights (mixed precision: an update smaller than bfloat16's resolution still moves a float32 weight)."""


def autocast_dtype(dtype: str) -> torch.dtype | None:
    """The autocast dtype of the `dtype` setting (None: the model computes in its weights' dtype)."""
    return AUTOCAST.get(dtype)


def check_device_fields(device: str, dtype: str, prefix: str) -> None:
    """Refuse, naming `<prefix>device` or `<prefix>dtype`, a value that is not one of the forms above, and
    bfloat16 on an explicit cpu (what the machine has is checked later, by resolve_device)."""
    check(isinstance(device, str) and DEVICE_PATTERN.fullmatch(device) is not None,
          f"{prefix}device must be auto, cpu, cuda or cuda:N (N a GPU index, e.g. cuda:0), got {device!r}")
    check(dtype in DTYPES, f"{prefix}dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    check(not (dtype == "bfloat16" and device == "cpu"),
          f"{prefix}dtype=bfloat16 needs a GPU (device=cuda or auto on a GPU machine); on the CPU use float32 or "
          f"{MIXED}")


def resolve_device(device: str, field: str = "device") -> torch.device:
    """The torch.device that setting `device` names on this machine. 'auto' is CUDA when
    torch.cuda.is_available(), else the CPU; 'cuda' / 'cuda:N' on a machine without CUDA, or N past its last
    GPU, is a ConfigError naming `field`."""
    if DEVICE_PATTERN.fullmatch(str(device)) is None:
        raise ConfigError(f"{field} must be auto, cpu, cuda or cuda:N (N a GPU index, e.g. cuda:0), got {device!r}")
    if device == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if device == "auto":
        return torch.device("cuda") if available else torch.device("cpu")
    if not available:
        raise ConfigError(f"{field}={device}: this machine has no CUDA device that torch {torch.__version__} can use "
                          "(use device=cpu, or auto to take a GPU only where there is one)")
    index = int(device.split(":")[1]) if ":" in device else None
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise ConfigError(f"{field}={device}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return torch.device(device)


class SlowBfloat16Warning(UserWarning):
    """bfloat16-mixed asked for on a CPU without bfloat16 matrix units: it runs, many times slower than float32."""


_WARNED: set[str] = set()
"""The dtype settings this process has warned about."""


def cpu_has_bfloat16_units(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Whether this CPU multiplies bfloat16 matrices in hardware (x86: AVX512-BF16 or AMX-BF16; Arm: BF16), read
    from `cpuinfo`'s flags; None where that file is missing or names no flags (not Linux: nothing is said)."""
    flags = _cpu_fields(cpuinfo)[1]
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def _cpu_fields(cpuinfo: str) -> tuple[str, set[str]]:
    """(the first model name `cpuinfo` lists, the flags of every CPU it lists); ('', set()) where it is missing."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "", set()
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model name") and not model:
            model = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return model, flags


def hardware(device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> str:
    """What a run's numbers were computed on, as its summary records it: the GPU's name, or the CPU's model, its
    widest vector unit and its threads (float32 sums may be rounded differently by AVX2 and AVX-512 kernels or
    by another number of threads, so the same seed is promised the same run only on the same hardware), and
    torch's version, e.g. 'AMD EPYC (AVX-512, BF16), 1 thread, torch 2.13.0+cpu'."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    model, flags = _cpu_fields(cpuinfo)
    units = ("AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags
             else "SVE" if "sve" in flags else "NEON" if "asimd" in flags else "")
    units += ", BF16" if flags & {"avx512_bf16", "amx_bf16", "bf16"} else ""
    threads = torch.get_num_threads()
    return (f"{model or device.type}{f' ({units})' if units else ''}, {threads} thread{'s' if threads > 1 else ''}, "
            f"torch {torch.__version__}")


def resolve_dtype(dtype: str, device: torch.device, field: str = "dtype") -> torch.dtype:
    """The weights' torch dtype of the setting `dtype`, on `device` (bfloat16 weights only on a GPU: a
    ConfigError naming `field`; bfloat16-mixed keeps float32 weights, so runs anywhere, and warns on a CPU
    without bfloat16 matrix units, where it is many times slower than float32)."""
    if dtype not in DTYPES:
        raise ConfigError(f"{field} must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "bfloat16" and device.type == "cpu":
        raise ConfigError(f"{field}={dtype} needs a GPU, and the device is the CPU; on the CPU use float32 or {MIXED}")
    if dtype == MIXED and device.type == "cpu" and MIXED not in _WARNED and cpu_has_bfloat16_units() is False:
        _WARNED.add(MIXED)  # once a process, however many of a command's steps resolve the setting
        warnings.warn(f"{field}={MIXED}: this CPU has no bfloat16 matrix units (AVX512-BF16, AMX or Arm BF16), so "
                      "torch runs bfloat16 products in slow kernels, over 10x slower than float32 "
                      "(bench/bf16_matmul.py measures it); float32 is faster here", SlowBfloat16Warning, stacklevel=2)
    return DTYPES[dtype]


def dtype_argument(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """The keyword transformers' loaders take a weights dtype by: `dtype` from 4.56 (which warns on the older
    `torch_dtype`), `torch_dtype` before it (a GPU machine may have an older transformers than credo pins)."""
    import transformers
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def device_name(device: torch.device) -> str:
    """How a run records the device it resolved to: 'cpu', 'cuda' or 'cuda:N' (a setting that loads back)."""
    return device.type if device.index is None else f"{device.type}:{device.index}"
