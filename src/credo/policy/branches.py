"""Branch scoring off a shared prefix KV cache for the tiny GPT: many short continuations ("branches"), each
teacher-forced after its own cut of a row's prompt + completion, scored in one tree-attention pass.

Branches are packed into bins of at most `bin_tokens` tokens (a branch never straddles bins); each bin gets a
copy of its row's prefix keys/values and attends to them plus its own tokens. Attention then costs
bins x bin_tokens x (S + bin_tokens) instead of rows x L x (S + L) with one packed row per trace (L = the
longest row's total branch tokens), and no row is padded to the longest row: with a group's tails after every
segment, L ran to 600-800 tokens where the real tokens averaged a third of that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from credo.policy.gpt import GPT

BIN_TOKENS = 128  # tokens per bin (or the longest branch, if longer): small keeps attention near-linear


@dataclass
class Packing:
    """Where each branch goes: bin_row[N] (the bin's row among the scored rows), and per branch its
    (bin, start in the bin); `width` is the bin length."""

    bin_row: list[int]
    placement: list[tuple[int, int]]
    width: int


def pack_branches(branch_rows: Sequence[int], lengths: Sequence[int], bin_tokens: int = BIN_TOKENS) -> Packing:
    """Branches (their row index and length) -> bins of one row each: per row, first-fit decreasing (longest
    branch first, into the first of the row's bins with room), which fills bins ~80% on RREDCoT's tails
    (first-fit in order: ~70%)."""
    width = max([bin_tokens, *lengths])
    bin_row: list[int] = []
    fill: list[int] = []
    row_bins: dict[int, list[int]] = {}
    placement: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (branch_rows[i], -lengths[i], i)):
        row, n = branch_rows[i], lengths[i]
        bins = row_bins.setdefault(row, [])
        b = next((b for b in bins if fill[b] + n <= width), None)
        if b is None:
            b = len(bin_row)
            bins.append(b)
            bin_row.append(row)
            fill.append(0)
        placement[i] = (b, fill[b])
        fill[b] += n
    return Packing(bin_row, placement, width)


@torch.no_grad()
def score_packed_branches(model: GPT, seq: torch.Tensor, mask: torch.Tensor, prompt_width: int,
                          branches: Sequence[tuple[int, int, Sequence[int]]], pad_id: int,
                          bin_tokens: int = BIN_TOKENS) -> list[torch.Tensor]:
    """seq[R, S] / mask[R, S]: the scored rows' left-padded prompt (width `prompt_width`) + right-padded completion;
    branches: (row index into seq, cut, tokens), `tokens` teacher-forced after prompt + completion[:cut].
    -> per branch, log-probs[len(tokens)] of its tokens."""
    device = seq.device
    P = prompt_width
    # the columns after the last cut are never attended to or read: not forwarded
    seq, mask = seq[:, :P + max(c for _, c, _ in branches)], mask[:, :P + max(c for _, c, _ in branches)]
    R, S = seq.shape
    prefix = model.new_cache(R, S)
    base_logp = F.log_softmax(model(seq, mask, prefix).float(), -1)  # [R, S, V]
    packing = pack_branches([r for r, _, _ in branches], [len(t) for _, _, t in branches], bin_tokens)
    N, C = len(packing.bin_row), packing.width
    rows = torch.tensor(packing.bin_row, dtype=torch.long, device=device)
    cache = model.new_cache(N, S + C)
    cache.k[:, :, :, :S] = prefix.k[:, rows]
    cache.v[:, :, :, :S] = prefix.v[:, rows]
    cache.length = S
    ids = torch.full((N, C), pad_id, dtype=torch.long, device=device)
    positions = torch.zeros(N, C, dtype=torch.long, device=device)
    attn = torch.zeros(N, C, S + C, dtype=torch.bool, device=device)
    diagonal = torch.arange(C, device=device)
    attn[:, diagonal, S + diagonal] = True  # padded queries see only themselves
    prompt_len = mask[:, :P].sum(1).tolist()
    tril = torch.ones(C, C, dtype=torch.bool, device=device).tril()
    for (b, start), (r, c, tokens) in zip(packing.placement, branches):
        n = len(tokens)
        ids[b, start:start + n] = torch.tensor(list(tokens), dtype=torch.long)
        positions[b, start:start + n] = torch.arange(prompt_len[r] + c, prompt_len[r] + c + n)
        attn[b, start:start + n, :P + c] = mask[r, :P + c]
        attn[b, start:start + n, S + start:S + start + n] = tril[:n, :n]
    tree_logp = F.log_softmax(model(ids, cache=cache, positions=positions, attn_mask=attn).float(), -1)  # [N, C, V]
    out = []
    for (b, start), (r, c, tokens) in zip(packing.placement, branches):
        n = len(tokens)
        target = torch.tensor(list(tokens), dtype=torch.long, device=device)
        logp = torch.cat([base_logp[r, P + c - 1][None], tree_logp[b, start:start + n - 1]], 0)  # [n, V]
        out.append(logp.gather(1, target[:, None]).squeeze(1))
    return out
