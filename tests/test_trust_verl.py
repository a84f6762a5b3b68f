"""Malformed verl batches: each is one UserError naming the field and the row, raised before
credo writes anything into the batch; before, they were silent wrong credit (a NaN reward zeroing its group,
token_level_rewards of the wrong width) or a raw RuntimeError / KeyError / IndexError / JSONDecodeError."""

import numpy as np
import pytest
import torch

from credo.core.config import UserError
from credo.integrations.verl import make_verl_estimator
from credo.integrations.verl_credit import apply_credit, credit_on_shards
from builders import to_dataproto


def bad_json(batch, row):
    extra = [dict(e) for e in batch.non_tensor_batch["extra_info"]]
    extra[row]["credo_problem"] = "{'key': not json"
    batch.non_tensor_batch["extra_info"] = np.array(extra, dtype=object)


def no_key(batch, row):
    extra = [dict(e) for e in batch.non_tensor_batch["extra_info"]]
    extra[row]["credo_problem"] = '{"prompt": "1+1"}'
    batch.non_tensor_batch["extra_info"] = np.array(extra, dtype=object)


def no_uid(batch, row):
    batch.batch.pop("credo_group")
    batch.non_tensor_batch.pop("uid")


def set_(field, value):
    def plant(batch, row):
        batch.batch[field] = value(batch.batch[field], row)
    return plant


def nan_at(t, row):
    t = t.clone()
    t[row, 0] = float("nan")
    return t


def out_of_vocab(t, row):
    t = t.clone()
    t[row, 1] = 10_000
    return t


def negative_id(t, row):
    t = t.clone()
    t[row, 0] = -1
    return t


# (name, plant(batch, row), row, what the one line says)
CASES = [
    ("nan reward", set_("token_level_rewards", nan_at), 5,
     "field 'token_level_rewards', row 5 (uid 'uid-1'), sums to nan"),
    ("reward width", set_("token_level_rewards", lambda t, r: t[:, :-1]), 0,
     "field 'token_level_rewards' has shape"),
    ("short attention mask", set_("attention_mask", lambda t, r: t[:, :-2]), 0, "field 'attention_mask' has shape"),
    ("response_mask width", set_("response_mask", lambda t, r: t[:, 1:]), 0, "field 'response_mask' has shape"),
    ("no uid", no_uid, 0, "non-tensor field 'uid' (each row's group"),
    ("token id past the vocabulary", set_("responses", out_of_vocab), 6,
     "field 'responses', row 6 (uid 'uid-1'), token 1 is id 10000, outside the model's vocabulary"),
    ("negative token id", set_("prompts", negative_id), 3, "field 'prompts', row 3 (uid 'uid-0'), token 0 is id -1"),
    ("non-JSON credo_problem", bad_json, 9, "field 'extra_info.credo_problem', row 9 (uid 'uid-2'), is not credo's "
                                            "problem JSON (JSONDecodeError"),
    ("credo_problem without its key", no_key, 2, "field 'extra_info.credo_problem', row 2 (uid 'uid-0'), is not "
                                                 "credo's problem JSON (KeyError"),
    ("empty batch", lambda batch, row: None, 0, "the batch has no rows"),
]


@pytest.mark.parametrize("name, plant, row, expect", CASES, ids=[c[0] for c in CASES])
def test_a_malformed_batch_is_one_line_naming_the_field_and_the_row(hf_setup, name, plant, row, expect):
    policy, task, r = hf_setup
    batch = to_dataproto(r, task, torch.arange(r.batch_size))
    if name == "empty batch":
        batch = batch.select_idxs(torch.zeros(len(batch), dtype=torch.bool))
    plant(batch, row)
    before = {k: v.clone() for k, v in batch.batch.items()}
    with pytest.raises(UserError) as err:
        apply_credit(batch, "grpo", module=policy.model, tokenizer=policy.tokenizer, task=task, step=3)
    message = str(err.value)
    assert "\n" not in message and message.startswith("verl batch at step 3: ") and expect in message, message
    assert set(batch.batch.keys()) == set(before)  # nothing written into the batch, nothing changed
    for key, value in before.items():
        torch.testing.assert_close(batch.batch[key], value, rtol=0, atol=0, equal_nan=True)


def test_the_driver_names_the_users_row_before_the_rows_are_dealt_out(hf_setup):
    """credit_on_shards reorders rows so each shard holds whole groups: a malformed row is named in the driver's
    order (the driver checks first; a worker names the row by credo_row, which the driver sets)."""
    policy, task, r = hf_setup
    order = torch.randperm(r.batch_size, generator=torch.Generator().manual_seed(0))
    batch = to_dataproto(r, task, order)
    bad_json(batch, 11)
    with pytest.raises(UserError, match=r"field 'extra_info.credo_problem', row 11 "):
        credit_on_shards(batch, {"estimator": "grpo", "step": 4}, lambda sub: sub, 2)
    shard = to_dataproto(r, task, order)
    shard.batch["credo_row"] = torch.arange(100, 100 + r.batch_size)  # as the driver tags a dealt-out shard
    set_("responses", out_of_vocab)(shard, 2)
    with pytest.raises(UserError, match=r"field 'responses', row 102 "):
        apply_credit(shard, "grpo", module=policy.model, tokenizer=policy.tokenizer, task=task)


def estimator_inputs(B=8, T=5):
    mask = torch.ones(B, T)
    rewards = torch.zeros(B, T)
    rewards[:, -1] = torch.tensor([1.0, 0.0] * (B // 2))
    return rewards, mask, np.array([f"uid-{i // 4}" for i in range(B)], dtype=object)


REWARD_ONLY_CASES = [
    ("nan reward", lambda r, m, i: (nan_at(r, 3), m, i),
     "field 'token_level_rewards', row 3 (uid 'uid-0'), sums to nan"),
    ("reward width", lambda r, m, i: (r[:, :-1], m, i), "field 'token_level_rewards' has shape (8, 4), response_mask "
                                                       "(8, 5)"),
    ("no uid", lambda r, m, i: (r, m, None), "no index (non-tensor field 'uid'"),
    ("uid length", lambda r, m, i: (r, m, i[:-1]), "field 'uid' has 7 entries for 8 rows"),
    ("empty batch", lambda r, m, i: (r[:0], m[:0], i[:0]), "the batch has no rows"),
]


@pytest.mark.parametrize("name, plant, expect", REWARD_ONLY_CASES, ids=[c[0] for c in REWARD_ONLY_CASES])
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_malformed_input_to_a_registered_estimator_is_one_line(name, plant, expect, estimator):
    rewards, mask, index = plant(*estimator_inputs())
    kwargs = {} if index is None else {"index": index}  # verl leaves index out when the batch has no uid
    with pytest.raises(UserError) as err:
        make_verl_estimator(estimator)(token_level_rewards=rewards, response_mask=mask, **kwargs)
    assert "\n" not in str(err.value) and expect in str(err.value), str(err.value)


class RefusingWrites:
    """A batch's TensorDict that refuses to store `refused` (a write failing part-way through apply_credit's)."""

    def __init__(self, tensors, refused):
        self.tensors, self.refused = tensors, refused

    def __setitem__(self, key, value):
        if key == self.refused:
            raise RuntimeError(f"cannot store {key}")
        self.tensors[key] = value

    def __getitem__(self, key):
        return self.tensors[key]

    def __delitem__(self, key):
        del self.tensors[key]

    def __getattr__(self, name):
        return getattr(self.tensors, name)


def test_apply_credit_writes_all_its_fields_or_none(hf_setup):
    """advantages, returns and credo_cost land together: a bool response_mask credits as the integer one does,
    and a write failing on the last field leaves the batch as it was (before, advantages and returns stayed)."""
    policy, task, r = hf_setup
    credited = []
    for convert in (lambda m: m, lambda m: m.bool()):
        batch = to_dataproto(r, task, torch.arange(r.batch_size))
        batch.batch["response_mask"] = convert(batch.batch["response_mask"])
        out = apply_credit(batch, "grpo", module=policy.model, tokenizer=policy.tokenizer, task=task, step=3)
        credited.append(out.batch["advantages"])
    torch.testing.assert_close(credited[0], credited[1], rtol=0, atol=0)
    batch = to_dataproto(r, task, torch.arange(r.batch_size))
    before = {k: v.clone() for k, v in batch.batch.items()}
    batch.batch = RefusingWrites(batch.batch, "credo_cost")
    with pytest.raises(RuntimeError, match="cannot store credo_cost"):
        apply_credit(batch, "grpo", module=policy.model, tokenizer=policy.tokenizer, task=task, step=3)
    assert set(batch.batch.keys()) == set(before)
