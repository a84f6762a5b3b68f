"""A CUDA device emulated on the CPU: device placement tested on a machine without a GPU.

Inside `with FakeCuda():`, torch.cuda.is_available() is True, and a tensor created on or moved to 'cuda'
lives on the CPU but is marked as a CUDA tensor: its `.device` reads cuda:0 and its `.is_cuda` True. What
CUDA refuses raises here too: an op mixing a marked tensor with an unmarked (CPU) tensor of one dimension or
more, a CPU tensor indexed by CUDA indices, a draw from a CPU generator into a CUDA tensor, and a CUDA tensor
read as a numpy array. What CUDA allows is allowed: a CPU scalar (0-dim) beside a CUDA tensor, a CUDA tensor
indexed by CPU indices or assigned CPU values, copies across devices, reading values (.item(), .tolist()).
The arithmetic itself is the CPU's, so results equal a CPU run's; only where the tensors are is emulated.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

CUDA = torch.device("cuda", 0)
_BASE = torch._C.TensorBase
# ops whose tensors may sit on different devices under CUDA (each one's own rule is checked below)
_MIXING_ALLOWED = {"copy_", "to", "cpu", "cuda", "__getitem__", "__setitem__", "__deepcopy__", "new_tensor",
                   "_has_compatible_shallow_copy_type"}


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)  # an int names a CUDA device


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


class FakeCuda(TorchFunctionMode):
    """`with FakeCuda() as fake:` runs the block with 'cuda' emulated (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._marked: dict[int, weakref.ref] = {}
        self.ops = 0  # ops seen on marked tensors: a test can check the emulation was exercised
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> "FakeCuda":
        fakes = {"is_available": lambda: True, "device_count": lambda: 1,
                 "get_device_name": lambda *a, **k: "fake cuda"}
        for name, fake in fakes.items():  # restored on exit: after the block the machine has no CUDA again
            self._saved[name] = getattr(torch.cuda, name)
            setattr(torch.cuda, name, fake)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        for name, real in self._saved.items():
            setattr(torch.cuda, name, real)
        super().__exit__(*exc)

    def is_cuda(self, t: torch.Tensor) -> bool:
        ref = self._marked.get(id(t))
        return ref is not None and ref() is t

    def _mark(self, out: Any, cuda: bool) -> Any:
        for t in _tensors(out):
            if cuda:
                self._marked[id(t)] = weakref.ref(t)
            else:
                self._marked.pop(id(t), None)
        return out

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        owner = getattr(func, "__self__", None)
        if owner is _BASE.device:  # Tensor.device
            return CUDA if self.is_cuda(args[0]) else func(*args)
        if owner is _BASE.is_cuda:
            return self.is_cuda(args[0])
        if owner is _BASE.data and getattr(func, "__name__", "") == "__set__":  # param.data = moved (Module.to)
            func(*args)
            self._mark(args[0], self.is_cuda(args[1]))
            return None
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor):
            return self._move(func, name, args, kwargs)
        to_cuda = "device" in kwargs and kwargs["device"] is not None and _is_cuda(kwargs["device"])
        if to_cuda:
            kwargs["device"] = "cpu"
        inputs = _tensors(args) + _tensors(kwargs)
        on_cuda = any(self.is_cuda(t) for t in inputs)
        if on_cuda:
            self.ops += 1
            self._check(name, args, kwargs, inputs)
        out = func(*args, **kwargs)
        if name == "__setitem__":
            return out
        if name in ("__getitem__", "__deepcopy__"):  # where the tensor itself is (a deepcopy's memo holds others)
            return self._mark(out, self.is_cuda(args[0]))
        if on_cuda or to_cuda:
            self._mark(out, True)
        return out

    def _check(self, name: str, args: tuple, kwargs: dict, inputs: list[torch.Tensor]) -> None:
        if name in ("__array__", "numpy"):
            raise TypeError("can't convert cuda:0 device type tensor to numpy (fake cuda)")
        generator = kwargs.get("generator")
        if isinstance(generator, torch.Generator) and generator.device.type == "cpu":
            raise RuntimeError(f"Expected a 'cuda' device type for generator but found 'cpu' ({name}, fake cuda)")
        if name == "__getitem__":
            if not self.is_cuda(args[0]):
                raise RuntimeError("indices should be either on cpu or on the same device as the indexed tensor "
                                   "(cpu) (fake cuda)")
            return
        if name in _MIXING_ALLOWED:
            return
        joins = name in ("cat", "concat", "concatenate", "stack", "hstack", "vstack")  # no CPU scalar either
        for t in inputs:
            if not self.is_cuda(t) and (t.dim() > 0 or joins):
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                   f"cuda:0 and cpu! ({name}, fake cuda)")

    def _move(self, func: Any, name: str, args: tuple, kwargs: dict) -> Any:
        """Tensor.to / .cuda() / .cpu(): a moved tensor is a copy, marked for where it went."""
        source, rest = args[0], list(args[1:])
        cuda = self.is_cuda(source)
        if name == "cuda":
            cuda, rest, kwargs = True, [], {k: v for k, v in kwargs.items() if k != "device"}
            func = _BASE.to
        elif name == "cpu":
            cuda = False
        for i, value in enumerate(rest):
            if isinstance(value, (str, torch.device)) or (isinstance(value, int) and not isinstance(value, bool)):
                cuda, rest[i] = _is_cuda(value), "cpu"
            elif isinstance(value, torch.Tensor):
                cuda = self.is_cuda(value)
        if kwargs.get("device") is not None:
            cuda, kwargs["device"] = _is_cuda(kwargs["device"]), "cpu"
        out = func(source, *rest, **kwargs)
        if out is source and cuda != self.is_cuda(source):
            out = out.clone()  # another device: another tensor
        return self._mark(out, cuda) if out is not source else out
