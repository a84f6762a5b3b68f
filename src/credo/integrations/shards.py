"""Data-parallel shards of one batch: whole groups per shard, batch-wide statistics by a collective.

Every credo estimator keeps its per-group work local (a group's rows must sit on one shard), and the
few batch-wide statistics (RREDCoT's z over all segments, SC-GRPO's quantile of D) go through
`Probe.gather`. `all_gather_1d` is that gather over a torch.distributed process group (gloo on CPU,
NCCL on GPUs), for verl workers and TRL/accelerate processes alike.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def all_gather_1d(values: torch.Tensor, group: Any = None) -> torch.Tensor:
    """values[n_r] on each rank -> cat over ranks in rank order (float64 on the wire, back to values' dtype).

    Lengths may differ by rank: the lengths are exchanged first, rows padded to the longest, trimmed after.
    """
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return values
    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    world = dist.get_world_size(group)
    local = values.detach().reshape(-1).to(device=device, dtype=torch.float64)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([local.numel()], dtype=torch.long, device=device), group=group)
    longest = int(max(int(s) for s in sizes))
    padded = torch.nn.functional.pad(local, (0, longest - local.numel()))
    parts = [torch.zeros(longest, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    out = torch.cat([p[:int(n)] for p, n in zip(parts, sizes)])
    return out.to(device=values.device, dtype=values.dtype)


def process_group_gather(group: Any = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A `Probe(gather=...)` function over `group` (None: the default process group)."""
    return lambda values: all_gather_1d(values, group)


def group_ids(keys: Any) -> torch.Tensor:
    """Dense long group ids[B] for per-row group keys (verl uids: strings or ints), in first-seen order."""
    first: dict[Any, int] = {}
    ids = [first.setdefault(k, len(first)) for k in list(keys)]
    return torch.tensor(ids, dtype=torch.long)


def whole_group_order(group: torch.Tensor, shards: int) -> torch.Tensor:
    """A row permutation[B] such that splitting the permuted batch into `shards` equal contiguous chunks
    (verl's DataProto.chunk, a data-parallel dispatch) puts each group on exactly one shard.

    Groups keep their first-seen order and are dealt out so each chunk gets the same number of rows; this
    needs equal group sizes and a group count divisible by `shards` (verl: train_batch_size % dp == 0 with
    rollout.n rows per prompt), which is checked with a one-line error naming the numbers.
    """
    keys, counts = _first_seen(group)
    if len(set(counts.tolist())) > 1:
        raise ValueError(f"credo credit on shards needs equal group sizes; got sizes {sorted(set(counts.tolist()))}")
    if len(keys) % shards:
        raise ValueError(f"credo credit on {shards} shards needs a group count divisible by {shards}; got {len(keys)} "
                         f"groups (make the number of prompts per step a multiple of the data-parallel size)")
    rows = {int(k): (group == k).nonzero().flatten() for k in keys.tolist()}
    return torch.cat([rows[int(k)] for k in keys.tolist()])


def _first_seen(group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    seen: dict[int, int] = {}
    for g in group.tolist():
        seen[g] = seen.get(g, 0) + 1
    return torch.tensor(list(seen), dtype=torch.long), torch.tensor(list(seen.values()), dtype=torch.long)
