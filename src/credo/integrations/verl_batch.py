"""What credo needs from a verl batch, checked before it reads one: each malformed field is one UserError
naming the field and the row, not a RuntimeError, KeyError, IndexError or JSONDecodeError from deep inside
(or, worse, credit computed from it: a NaN reward zeroing its group, a reward tensor of the wrong width).

`check_batch` (a DataProto shard, apply_credit and credit_on_shards) and `check_estimator_inputs` (the tensors
verl hands a registered advantage estimator). Unlike the credit checks (credo.integrations.checks), these
cannot be turned off: credo cannot compute credit from such a batch at all.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np
import torch

from credo.core.config import UserError
from credo.core.protocols import Problem

PROBLEM_FIELD = "extra_info.credo_problem"


def row_namer(batch: Any) -> Callable[[int], str]:
    """row_name(i) for shard row i: the driver's row (credo_row, set by credit_on_shards) and its uid."""
    t, nt = batch.batch, batch.non_tensor_batch
    original = t["credo_row"].tolist() if t is not None and "credo_row" in t.keys() else None
    uids = nt.get("uid") if isinstance(nt, dict) else None

    def name(i: int) -> str:
        row = original[i] if original is not None else i
        uid = f" (uid {uids[i]!r})" if uids is not None and i < len(uids) else ""
        return f"row {row}{uid}"
    return name


def reward_field(batch: Any) -> str:
    """The reward field credo reads: token_level_rewards (after a KL-in-reward penalty) if present."""
    return "token_level_rewards" if "token_level_rewards" in batch.batch.keys() else "token_level_scores"


def check_batch(batch: Any, vocab_size: int | None = None, step: Any = None) -> None:
    """A verl DataProto shard credo can read (module docstring of verl_credit for the fields); vocab_size: the
    scoring model's (token ids outside it would index past its embedding)."""
    at = "" if step is None else f" at step {step}"
    if batch.batch is None or len(batch) == 0:
        raise UserError(f"verl batch{at}: the batch has no rows (an empty DataProto): credo needs whole groups of rows")
    t, name = batch.batch, row_namer(batch)
    present = sorted(t.keys())
    for field in ("prompts", "responses", "attention_mask"):
        if field not in present:
            raise UserError(f"verl batch{at}: field {field!r} is missing (the batch has {present})")
    if "token_level_rewards" not in present and "token_level_scores" not in present:
        raise UserError(f"verl batch{at}: field 'token_level_rewards' (or token_level_scores) is missing "
                        f"(the batch has {present})")
    B, P = t["prompts"].shape
    R = t["responses"].shape[1]
    expected = {"attention_mask": (B, P + R), "response_mask": (B, R), reward_field(batch): (B, R),
                "old_log_probs": (B, R)}
    for field, shape in expected.items():
        if field in present and tuple(t[field].shape) != shape:
            raise UserError(f"verl batch{at}: field {field!r} has shape {tuple(t[field].shape)}, every row needs "
                            f"{shape[1]} columns (prompts {P} + responses {R} for attention_mask, responses {R} "
                            "otherwise)")
    _check_groups_given(batch, B, at)
    _check_rewards_finite(t[reward_field(batch)], reward_field(batch), name, at)
    if vocab_size is not None:
        for field in ("prompts", "responses"):
            ids = t[field]
            bad = ((ids < 0) | (ids >= vocab_size)).nonzero()
            if len(bad):
                row, col = (int(v) for v in bad[0])
                raise UserError(f"verl batch{at}: field {field!r}, {name(row)}, token {col} is id "
                                f"{int(ids[row, col])}, outside the model's vocabulary (0..{vocab_size - 1})")
    for i in range(B):
        problem_from_row(batch, i, name, at)


def _check_groups_given(batch: Any, B: int, at: str) -> None:
    t, nt = batch.batch, batch.non_tensor_batch
    if "credo_group" in t.keys():
        return
    if "uid" not in nt:
        raise UserError(f"verl batch{at}: non-tensor field 'uid' (each row's group: the prompt it was sampled from) "
                        f"is missing (the batch has {sorted(nt)})")
    if len(nt["uid"]) != B:
        raise UserError(f"verl batch{at}: field 'uid' has {len(nt['uid'])} entries for {B} rows")


def _check_rewards_finite(scores: torch.Tensor, field: str, name: Callable[[int], str], at: str) -> None:
    """A NaN/inf reward would zero its group's advantages (verl's std is NaN there) or poison every one."""
    sums = scores.sum(-1)
    bad = (~torch.isfinite(sums)).nonzero().flatten()
    if len(bad):
        row = int(bad[0])
        raise UserError(f"verl batch{at}: rewards_finite: field {field!r}, {name(row)}, sums to {float(sums[row])} "
                        f"({len(bad)} of {len(sums)} rows not finite): the reward function must return finite numbers")


def problem_from_row(batch: Any, i: int, name: Callable[[int], str] | None = None, at: str = "") -> Problem | None:
    """Row i's credo Problem from its credo_problem JSON (a top-level column or extra_info's key), None when the
    row has none; JSON that is not credo's problem record is an error naming the field and the row."""
    nt = batch.non_tensor_batch
    field, encoded = "credo_problem", nt["credo_problem"][i] if "credo_problem" in nt else None
    extra = nt["extra_info"][i] if "extra_info" in nt else None
    if encoded is None and isinstance(extra, dict):
        field, encoded = PROBLEM_FIELD, extra.get("credo_problem")
    if encoded is None:
        return None
    try:
        d = json.loads(encoded)
        return Problem(key=d["key"], prompt=d["prompt"], answer=str(d["answer"]), data=d.get("data") or {})
    except (TypeError, ValueError, KeyError) as err:  # JSONDecodeError is a ValueError
        where = (name or (lambda k: f"row {k}"))(i)
        raise UserError(f"verl batch{at}: field {field!r}, {where}, is not credo's problem JSON "
                        f"({type(err).__name__}: {err}); write rows with credo.integrations.verl.dataset_row") from None


def check_estimator_inputs(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                           step: Any) -> None:
    """The tensors verl hands a registered estimator: rewards[B, R], response_mask[B, R], index[B] (uids)."""
    at = f" at step {step}"
    if token_level_rewards.dim() != 2 or token_level_rewards.shape[0] == 0:
        raise UserError(f"verl batch{at}: token_level_rewards has shape {tuple(token_level_rewards.shape)}: "
                        "the batch has no rows")
    if tuple(token_level_rewards.shape) != tuple(response_mask.shape):
        raise UserError(f"verl batch{at}: field 'token_level_rewards' has shape {tuple(token_level_rewards.shape)}, "
                        f"response_mask {tuple(response_mask.shape)}: every row needs one reward per response token")
    B = token_level_rewards.shape[0]
    if index is None:
        raise UserError(f"verl batch{at}: no index (non-tensor field 'uid', each row's group): credo's group "
                        "estimators need it")
    if len(np.asarray(index).reshape(-1)) != B:
        raise UserError(f"verl batch{at}: field 'uid' has {len(np.asarray(index).reshape(-1))} entries for {B} rows")
    uids = np.asarray(index).reshape(-1)
    _check_rewards_finite(token_level_rewards, "token_level_rewards", lambda i: f"row {i} (uid {uids[i]!r})", at)
