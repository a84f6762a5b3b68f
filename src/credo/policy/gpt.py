"""A small pre-LN GPT (SDPA attention, learned positions, tied embeddings) with a preallocated KV cache.

Fits in one reading, nanoGPT-style. Rows may be left-padded: positions come from the attention
mask (`cumsum(mask) - 1`), and padded keys are never attended to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the tiny GPT. Defaults: 4 layers x 128 wide, 4 heads, ~0.8M parameters."""

    vocab_size: int = 32
    """Token ids the embedding and output layers cover (> 0)."""
    n_layer: int = 4
    """Transformer blocks (> 0)."""
    d_model: int = 128
    """Width of the residual stream (> 0, divisible by n_head)."""
    n_head: int = 4
    """Attention heads per block (> 0)."""
    max_len: int = 256
    """Context length in tokens: prompt and completion together (> 0)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "d_model", "n_head", "max_len"):  # before the division below
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}")


class KVCache:
    """Preallocated keys/values for every layer: k, v [n_layer, B, H, max_len, Dh].

    `key_mask[B, max_len]` marks real (non-pad) keys; `next_position[B]` is the position id the next
    real token of each row will get; `length` is how many columns are filled.
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        head_dim = config.d_model // config.n_head
        shape = (config.n_layer, batch, config.n_head, max_len, head_dim)
        # uninitialised: a column is written before any read of it (reads stop at `length`), and zeroing
        # two large buffers per sampling call cost more than a decode step
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.key_mask = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.next_position = torch.zeros(batch, dtype=torch.long, device=device)
        self.length = 0
        self.max_len = max_len


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, layer: int,
                cache: KVCache | None) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, L, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            start = cache.length
            cache.k[layer, :, :, start:start + L] = k
            cache.v[layer, :, :, start:start + L] = v
            k = cache.k[layer, :, :, :start + L]
            v = cache.v[layer, :, :, :start + L]
        if attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif L == 1:
            # one query per row (decoding): plain matmuls beat SDPA's kernel dispatch at this size on CPU
            scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
            y = scores.masked_fill(~attn_mask, float("-inf")).softmax(-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.proj(y.transpose(1, 2).reshape(B, L, D))

    def decode(self, x: torch.Tensor, hidden: torch.Tensor, layer: int, cache: KVCache) -> torch.Tensor:
        """`forward` for one new token per row with a cache, with fewer tensor operations and the same numbers.

        x[B, 1, D]; hidden[B, 1, 1, S] (S = cache.length + 1) True where a key must not be attended to."""
        B, _, D = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).view(B, 3, H, 1, D // H).unbind(1)  # [B, H, 1, Dh] each: L = 1 needs no transpose
        start = cache.length
        cache.k[layer, :, :, start] = k[:, :, 0]
        cache.v[layer, :, :, start] = v[:, :, 0]
        scores = (q @ cache.k[layer, :, :, :start + 1].transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        y = scores.masked_fill(hidden, float("-inf")).softmax(-1) @ cache.v[layer, :, :, :start + 1]
        return self.proj(y.view(B, 1, D))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(),
                                 nn.Linear(4 * config.d_model, config.d_model))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, layer: int,
                cache: KVCache | None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), attn_mask, layer, cache)
        return x + self.mlp(self.ln2(x))

    def decode(self, x: torch.Tensor, hidden: torch.Tensor, layer: int, cache: KVCache) -> torch.Tensor:
        """`forward` for one new token per row (see SelfAttention.decode)."""
        x = x + self.attn.decode(self.ln1(x), hidden, layer, cache)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.tok_emb.weight
        return KVCache(self.config, batch, max_len, p.device, p.dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: KVCache | None = None, positions: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids[B, L] -> logits[B, L, V].

        attention_mask[B, L] (bool, True = real token) enables left/right padding; None means every
        token is real and plain causal attention is used. With `cache`, the L new tokens are appended
        after the cached ones. `positions[B, L]` with `attn_mask[B, L, S]` (S = cached + L keys) give
        full control (tree attention: many branches off one cached prefix in one pass); the new
        tokens are then not recorded as real keys for later calls.
        """
        B, L = input_ids.shape
        start = cache.length if cache is not None else 0
        if positions is not None and attn_mask is not None:
            if cache is not None and start + L > cache.max_len:
                raise ValueError(f"sequence of {start + L} tokens exceeds the KV cache of {cache.max_len}")
            if cache is not None:
                cache.key_mask[:, start:start + L] = False
            attn_mask = attn_mask[:, None]
        elif attention_mask is None and cache is None:
            positions = torch.arange(L, device=input_ids.device).expand(B, L)
            attn_mask = None
        else:
            mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
            offset = cache.next_position[:, None] if cache is not None else 0
            positions = (offset + mask.long().cumsum(1) - 1).clamp(min=0)
            if cache is not None:
                if start + L > cache.max_len:
                    raise ValueError(f"sequence of {start + L} tokens exceeds the KV cache of {cache.max_len}")
                cache.key_mask[:, start:start + L] = mask
                cache.next_position += mask.long().sum(1)
                key_mask = cache.key_mask[:, :start + L]
            else:
                key_mask = mask
            query_pos = torch.arange(start, start + L, device=input_ids.device)
            key_pos = torch.arange(start + L, device=input_ids.device)
            causal = key_pos[None, :] <= query_pos[:, None]  # [L, S]
            attn_mask = (causal[None] & key_mask[:, None, :]) | (key_pos[None, None, :] == query_pos[None, :, None])
            attn_mask = attn_mask[:, None]  # [B, 1, L, S]; a query always sees itself, so pad rows stay finite
        if int(positions.max()) >= self.config.max_len:
            raise ValueError(f"position {int(positions.max())} exceeds model.max_len={self.config.max_len}")
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, i, cache)
        if cache is not None:
            cache.length += L
        return F.linear(self.ln_f(x), self.tok_emb.weight)

    def decode_step(self, token: torch.Tensor, live: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """token[B] (long), live[B] (bool, False = padding after the row's EOS) appended to a filled cache ->
        next-token logits[B, V].

        The sampling loop's step: bit-identical to `forward(token[:, None], live[:, None], cache)[:, -1]`
        (tests/test_sampling_speed.py) with a third of its tensor operations: one new column needs no
        cumsum for its position and no causal mask (it sees every cached real key and itself)."""
        start = cache.length
        if start == 0 or start >= min(cache.max_len, self.config.max_len):  # the general path raises the errors
            return self.forward(token[:, None], live[:, None], cache)[:, -1]
        position = (cache.next_position + live.long() - 1).clamp(min=0)  # <= start < max_len: no check needed
        cache.key_mask[:, start] = live
        cache.next_position += live.long()
        hidden = ~cache.key_mask[:, None, None, :start + 1]
        hidden[..., start] = False  # a query always sees itself, so a pad row stays finite
        x = self.tok_emb(token[:, None]) + self.pos_emb(position[:, None])
        for i, block in enumerate(self.blocks):
            x = block.decode(x, hidden, i, cache)
        cache.length += 1
        return F.linear(self.ln_f(x), self.tok_emb.weight)[:, -1]
