"""A transformers KV cache that writes each new token into preallocated buffers instead of growing by `torch.cat`.

transformers' DynamicCache concatenates every layer's keys and values with the new token's at every decode step,
so sampling T tokens copies the whole cache T times (quadratic in the length): on SmolLM2-135M on a CPU that copy
was a third of the sampling time (bench/vs_trl.py). Here each layer keeps buffers[B, H, capacity, D] and hands the
model views of their first `length` columns: the attention reads the same numbers in the same order, so sampling
is bit-identical to DynamicCache (tests/test_hf.py). Imported lazily: it needs transformers.
"""

from __future__ import annotations

import functools

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's cache: keys/values are views [B, H, length, D] of buffers [B, H, capacity, D]; a write past
    the capacity grows the buffers (doubling), so a wrong capacity costs a copy, never a wrong result. Every
    inherited method that replaces `keys`/`values` acts on the buffers here (crop needs nothing: the length is
    read from `keys`, and the next write lands after it) or refuses (offloading, which credo never asks for)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def _grow(self, buffer: torch.Tensor | None, new: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
        """A buffer [B, H, capacity, D] holding the first `length` columns of `buffer` (None when empty)."""
        grown = new.new_empty(new.shape[0], new.shape[1], capacity, new.shape[3])
        if length:
            grown[:, :, :length] = buffer[:, :, :length]
        return grown

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write key/value_states[B, H, L, D] after the cached columns -> (keys, values)[B, H, length + L, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if self.key_buffer is None or end > self.key_buffer.shape[-2]:
            capacity = max(end, self.capacity, 2 * (self.key_buffer.shape[-2] if self.key_buffer is not None else 0))
            self.key_buffer = self._grow(self.key_buffer, key_states, length, capacity)
            self.value_buffer = self._grow(self.value_buffer, value_states, length, capacity)
        self.key_buffer[:, :, length:end] = key_states
        self.value_buffer[:, :, length:end] = value_states
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` (repeats allowed: a shared prompt's cache gathered to its group's rows)."""
        length = self.get_seq_length()
        if length > 0:
            self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
            self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Beam search's reordering: the rows `beam_idx`, buffers included (DynamicLayer's would reorder the
        views only, and the next write would bring back the old order)."""
        self.batch_select_indices(beam_idx.to(self.key_buffer.device) if self.key_buffer is not None else beam_idx)

    def offload(self) -> None:
        raise NotImplementedError("PreallocatedLayer does not offload (its buffers would stay behind); "
                                  "use transformers' DynamicCache for an offloaded cache")

    def prefetch(self) -> None:
        raise NotImplementedError("PreallocatedLayer does not offload, so there is nothing to prefetch")

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row `repeats` times in place of it (transformers' expansion for num_return_sequences)."""
        length = self.get_seq_length()
        if length > 0:
            self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
            self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
            self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = None
        super().reset()


def preallocated_cache(capacity: int) -> DynamicCache:
    """A DynamicCache whose layers are PreallocatedLayer(capacity): capacity = prompt width + new tokens."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = functools.partial(PreallocatedLayer, capacity)
    return cache
