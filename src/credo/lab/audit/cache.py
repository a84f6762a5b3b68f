"""The audit's cache of sampled traces and their MC reference, without pickle.

An entry `<key>` is `<key>.safetensors` (every tensor: the rollouts' fields, each row's MC values and
samples) and `<key>.json` (completions, costs, the problem key of each row), written in that order
so the JSON's presence marks a complete entry. Problems are not stored: they are rebuilt from the
task's held-out split and checked against the stored keys.

An entry is reused only under the hash of its content: the JSON records the sha256 of both files' content
(`content_sha256`: the tensor file's bytes and the JSON's other fields), and an entry whose content no longer
hashes to it (an edited figure, a tensor changed in place, or an entry from before the hash) is rebuilt, not
reused. Like a checkpoint's manifest this catches accidents and casual edits, not a forger who recomputes the
hash (docs/trust.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any, Sequence

import torch

from credo.core.values import MCValues
from credo.core.rollouts import Rollouts
from credo.core.state_io import CorruptStateError, load_state, save_state
from credo.core.protocols import Problem

CONTENT_HASH = "content_sha256"
_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "group", "rewards", "old_logprobs",
            "correct", "segment_ids", "loss_mask", "ref_logprobs")


def save_cached(stem: str, rollouts: Rollouts, segment_ids: torch.Tensor, reference: MCValues,
                reference_cost: dict[str, float], trace_tokens: float) -> None:
    """Write cache entry `stem` (a path without suffix)."""
    folder, name = os.path.split(stem)
    os.makedirs(folder, exist_ok=True)
    tensors = {f"rollouts.{f}": getattr(rollouts, f) for f in _TENSORS if getattr(rollouts, f) is not None}
    tensors["segment_ids"] = segment_ids
    tensors.update({f"values.{i}": v for i, v in enumerate(reference.values)})
    tensors.update({f"samples.{i}": s for i, s in enumerate(reference.samples)})
    meta = {"completions": list(rollouts.completions), "problem_keys": [p.key for p in rollouts.problems],
            "reference_cost": reference_cost, "trace_tokens": trace_tokens, "rows": len(reference.values)}
    tmp_name = f".tmp-{os.getpid()}-{name}"
    save_state(folder, tmp_name, tensors, meta)
    tmp = os.path.join(folder, tmp_name)
    hashed_meta = {**meta, CONTENT_HASH: content_sha256(tmp + ".safetensors", meta)}
    with open(tmp + ".json", "w") as f:
        json.dump(hashed_meta, f)
    os.replace(tmp + ".safetensors", stem + ".safetensors")
    os.replace(tmp + ".json", stem + ".json")


def content_sha256(tensor_file: str, meta: dict[str, Any]) -> str:
    """sha256 of an entry's content: its tensor file's bytes, then its JSON fields (but the hash itself) in a
    canonical form."""
    h = hashlib.sha256()
    with open(tensor_file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    fields = {k: v for k, v in meta.items() if k != CONTENT_HASH}
    h.update(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def load_cached(stem: str, heldout: Sequence[Problem]) -> dict[str, Any] | None:
    """The entry at `stem` as AuditData's fields, or None if there is none or its content does not hash to the
    hash it records (rebuilt, then). `heldout`: the task's held-out problems, indexed by the rollouts' group. A
    damaged entry is an error naming its file."""
    if not os.path.exists(stem + ".json"):
        return None
    folder, name = os.path.split(stem)
    try:
        tensors, meta = load_state(folder, name)
        if meta.get(CONTENT_HASH) != content_sha256(stem + ".safetensors", meta):
            print(f"audit: the cache entry {stem}.* does not hash to its recorded content (edited, or older than "
                  "the hash); rebuilding it", file=sys.stderr, flush=True)
            return None
        fields = {f: tensors.get(f"rollouts.{f}") for f in _TENSORS}
        rows = int(meta["rows"])
        problems = [heldout[g] for g in fields["group"].tolist()]
        if [p.key for p in problems] != meta["problem_keys"]:
            raise ValueError("its problems are not this task's held-out problems")
        rollouts = Rollouts(**fields, problems=problems, completions=list(meta["completions"]))
        reference = MCValues([tensors[f"values.{i}"] for i in range(rows)],
                             [tensors[f"samples.{i}"] for i in range(rows)])
        return {"rollouts": rollouts, "segment_ids": tensors["segment_ids"], "reference": reference,
                "reference_cost": dict(meta["reference_cost"]), "trace_tokens": float(meta["trace_tokens"])}
    except CorruptStateError as err:
        raise CorruptStateError(f"audit cache entry damaged: {err}; delete {stem}.* to rebuild it") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise CorruptStateError(f"audit cache entry {stem}.json does not fit ({err}); "
                                f"delete {stem}.* to rebuild it") from None
