"""f9587d4's tiny-GPT sampling loop, frozen as the reference path for bench/throughput.py and the tests that pin
the fast path to it (tests/test_sampling_speed.py).

A verbatim copy of that commit's `generate` + `pick_tokens` (credo/policy/base.py), its `KVCache` and the cached
forward of its GPT (credo/policy/gpt.py, `GPT.forward` + `SelfAttention.forward`, rewritten as functions over a
model's modules so later edits of gpt.py cannot change the reference). Do not optimise this file.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from credo.core.protocols import Samples, SamplingConfig
from credo.policy.base import sample_by_inverse_cdf
from credo.policy.gpt import GPT


class ReferenceKVCache:
    """f9587d4's KVCache: k, v [n_layer, B, H, max_len, Dh] in two zeroed tensors."""

    def __init__(self, model: GPT, batch: int, max_len: int) -> None:
        c, p = model.config, model.tok_emb.weight
        shape = (c.n_layer, batch, c.n_head, max_len, c.d_model // c.n_head)
        self.k = torch.zeros(shape, device=p.device, dtype=p.dtype)
        self.v = torch.zeros(shape, device=p.device, dtype=p.dtype)
        self.key_mask = torch.zeros(batch, max_len, dtype=torch.bool, device=p.device)
        self.next_position = torch.zeros(batch, dtype=torch.long, device=p.device)
        self.length = 0
        self.max_len = max_len


def _attention(attn: torch.nn.Module, x: torch.Tensor, attn_mask: torch.Tensor, layer: int,
               cache: ReferenceKVCache) -> torch.Tensor:
    B, L, D = x.shape
    q, k, v = attn.qkv(x).split(D, dim=2)
    q, k, v = (t.view(B, L, attn.n_head, D // attn.n_head).transpose(1, 2) for t in (q, k, v))
    start = cache.length
    cache.k[layer, :, :, start:start + L] = k
    cache.v[layer, :, :, start:start + L] = v
    k = cache.k[layer, :, :, :start + L]
    v = cache.v[layer, :, :, :start + L]
    if L == 1:
        scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        y = scores.masked_fill(~attn_mask, float("-inf")).softmax(-1) @ v
    else:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    return attn.proj(y.transpose(1, 2).reshape(B, L, D))


def reference_forward(model: GPT, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      cache: ReferenceKVCache) -> torch.Tensor:
    """f9587d4's `GPT.forward(input_ids[B, L], attention_mask[B, L], cache)` -> logits[B, L, V]."""
    B, L = input_ids.shape
    start = cache.length
    mask = attention_mask.bool()
    offset = cache.next_position[:, None]
    positions = (offset + mask.long().cumsum(1) - 1).clamp(min=0)
    if start + L > cache.max_len:
        raise ValueError(f"sequence of {start + L} tokens exceeds the KV cache of {cache.max_len}")
    cache.key_mask[:, start:start + L] = mask
    cache.next_position += mask.long().sum(1)
    key_mask = cache.key_mask[:, :start + L]
    query_pos = torch.arange(start, start + L, device=input_ids.device)
    key_pos = torch.arange(start + L, device=input_ids.device)
    causal = key_pos[None, :] <= query_pos[:, None]
    attn_mask = (causal[None] & key_mask[:, None, :]) | (key_pos[None, None, :] == query_pos[None, :, None])
    attn_mask = attn_mask[:, None]
    if int(positions.max()) >= model.config.max_len:
        raise ValueError(f"position {int(positions.max())} exceeds model.max_len={model.config.max_len}")
    x = model.tok_emb(input_ids) + model.pos_emb(positions)
    for i, block in enumerate(model.blocks):
        x = x + _attention(block.attn, block.ln1(x), attn_mask, i, cache)
        x = x + block.mlp(block.ln2(x))
    cache.length += L
    return F.linear(model.ln_f(x), model.tok_emb.weight)


def reference_pick_tokens(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """f9587d4's `pick_tokens`."""
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    probs = F.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < sampling.top_p
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    if generator.device != probs.device:
        return sample_by_inverse_cdf(probs, generator)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def reference_generate(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prompt_ids: torch.Tensor,
                       prompt_mask: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator, *,
                       eos_id: int, pad_id: int, banned_ids: Sequence[int] = ()) -> Samples:
    """f9587d4's `generate`."""
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    tokens, logps = [], []
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    logits = step(prompt_ids, prompt_mask)
    for _ in range(sampling.max_new_tokens):
        logits = logits.float()
        raw_logp = F.log_softmax(logits, dim=-1)
        if banned_ids:
            logits[:, list(banned_ids)] = float("-inf")
        token = reference_pick_tokens(logits, sampling, generator)
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        tokens.append(token)
        logps.append(torch.where(finished, torch.zeros(B, device=device),
                                 raw_logp.gather(1, token[:, None]).squeeze(1)))
        live = ~finished
        finished = finished | (token == eos_id)
        if bool(finished.all()):
            break
        logits = step(token[:, None], live[:, None])
    if not tokens:
        empty = torch.zeros(B, 0, dtype=torch.long, device=device)
        return Samples(empty, empty.bool(), empty.float())
    completion_ids = torch.stack(tokens, 1)
    done_before = torch.cat([torch.zeros(B, 1, dtype=torch.bool, device=device),
                             (completion_ids == eos_id).cumsum(1)[:, :-1] > 0], 1)
    completion_mask = ~done_before
    completion_ids = completion_ids.masked_fill(~completion_mask, pad_id)
    return Samples(completion_ids, completion_mask, torch.stack(logps, 1) * completion_mask)


@torch.no_grad()
def reference_sample(model: GPT, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingConfig,
                     generator: torch.Generator, *, eos_id: int, pad_id: int, banned_ids: Sequence[int]) -> Samples:
    """f9587d4's `TinyPolicy.sample` on `model`."""
    was_training = model.training
    model.eval()
    budget = min(sampling.max_new_tokens, model.config.max_len - prompt_ids.shape[1])
    if budget < sampling.max_new_tokens:
        sampling = SamplingConfig(sampling.temperature, sampling.top_p, max(budget, 0))
    cache = ReferenceKVCache(model, prompt_ids.shape[0], prompt_ids.shape[1] + sampling.max_new_tokens)
    out = reference_generate(lambda ids, mask: reference_forward(model, ids, mask, cache)[:, -1], prompt_ids,
                             prompt_mask, sampling, generator, eos_id=eos_id, pad_id=pad_id, banned_ids=banned_ids)
    model.train(was_training)
    return out


@torch.no_grad()
def reference_score_branches(model: GPT, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                             completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                             branches: Sequence[tuple[int, int, Sequence[int]]], pad_id: int) -> list[torch.Tensor]:
    """f9587d4's `TinyPolicy.score_branches` with reuse_prefix (one packed tree row per trace)."""
    device = prompt_ids.device
    rows = sorted({r for r, _, _ in branches})
    row_index = {r: i for i, r in enumerate(rows)}
    P = prompt_ids.shape[1]
    seq = torch.cat([prompt_ids[rows], completion_ids[rows]], 1)
    mask = torch.cat([prompt_mask[rows], completion_mask[rows]], 1)
    packed: list[list[int]] = [[] for _ in rows]
    placement = []
    for r, c, tokens in branches:
        i = row_index[r]
        placement.append((i, len(packed[i]), c))
        packed[i].extend(tokens)
    L = max(len(p) for p in packed)
    S = seq.shape[1]
    cache = model.new_cache(len(rows), S + L)
    base_logits = model(seq, mask, cache)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long, device=device)
    positions = torch.zeros(len(rows), L, dtype=torch.long, device=device)
    attn = torch.zeros(len(rows), L, S + L, dtype=torch.bool, device=device)
    prompt_len = prompt_mask[rows].sum(1)
    for q in range(L):
        attn[:, q, S + q] = True
    for (i, start, c), (_, _, tokens) in zip(placement, branches):
        n = len(tokens)
        ids[i, start:start + n] = torch.tensor(list(tokens), dtype=torch.long)
        positions[i, start:start + n] = prompt_len[i] + c + torch.arange(n)
        attn[i, start:start + n, :P + c] = mask[i, :P + c]
        attn[i, start:start + n, S + start:S + start + n] = torch.ones(n, n, dtype=torch.bool).tril()
    tree_logits = model(ids, cache=cache, positions=positions, attn_mask=attn)
    out = []
    for (i, start, c), (_, _, tokens) in zip(placement, branches):
        n = len(tokens)
        logits = torch.cat([base_logits[i, P + c - 1][None], tree_logits[i, start:start + n - 1]], 0)
        target = torch.tensor(list(tokens), dtype=torch.long, device=device)
        out.append(torch.log_softmax(logits.float(), -1).gather(1, target[:, None]).squeeze(1))
    return out
