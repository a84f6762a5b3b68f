"""A batch's memory bounded by its longest row: the rows of a sampling or scoring pass split into consecutive
sub-batches of at most `budget` padded tokens, each padded only to its own longest prompt.

Left padding makes every row of a batch as long as its longest prompt, so a few long questions among many
short ones multiply the KV cache of the whole batch (rows x longest prompt). A batch under the budget is one
chunk and runs exactly as before.
"""

from __future__ import annotations

from typing import Sequence

import torch

from credo.policy.base import Samples


def row_chunks(prompt_mask: torch.Tensor, new_tokens: int, budget: int) -> list[torch.Tensor]:
    """Row indices of consecutive sub-batches of prompt_mask[B, P] (True = a real prompt token), each with
    rows x (its longest prompt + new_tokens) <= budget, or a single row when one row alone is over it.
    One chunk (every row) when the whole padded batch, B x (P + new_tokens), is within the budget."""
    rows = prompt_mask.shape[0]
    if rows * (prompt_mask.shape[1] + new_tokens) <= budget:
        return [torch.arange(rows)]
    lengths = prompt_mask.sum(1).tolist()
    chunks, start, longest = [], 0, 0
    for row, length in enumerate(lengths):
        wider = max(longest, int(length))
        if row > start and (row - start + 1) * (wider + new_tokens) > budget:
            chunks.append(torch.arange(start, row))
            start, wider = row, int(length)
        longest = wider
    chunks.append(torch.arange(start, rows))
    return chunks


def trim_left_padding(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids[b, P], mask[b, P] (left-padded) without the leading columns that are padding in every row."""
    real = mask.any(0).nonzero()
    first = int(real[0]) if real.numel() else mask.shape[1]
    return ids[:, first:], mask[:, first:]


def stitch_samples(parts: Sequence[Samples], pad_id: int) -> Samples:
    """Sub-batches' Samples in order, as one: each right-padded (pad_id, mask False, log-prob 0) to the widest."""
    width = max(p.completion_ids.shape[1] for p in parts)

    def widen(t: torch.Tensor, fill: float | int | bool) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

    return Samples(torch.cat([widen(p.completion_ids, pad_id) for p in parts]),
                   torch.cat([widen(p.completion_mask, False) for p in parts]),
                   torch.cat([widen(p.logprobs, 0.0) for p in parts]))
