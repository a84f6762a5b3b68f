import pytest
import torch

from builders import probe_for, two_group_batch
from credo import credit
from credo.core.groups import grpo_advantages
from credo.core.values import step_differences
from credo.credit.rredcot import RREDCoTConfig, probe_values
from credo.tasks.arith import ArithTask


@pytest.mark.parametrize("mode", ["normalized", "absolute"])
@pytest.mark.parametrize("v0", ["probe", "group_mean"])
@pytest.mark.parametrize("candidates", ["suffixes", "answers"])
def test_redistribution_telescopes_and_values_are_probabilities(policy, mode, v0, candidates):
    task = ArithTask()
    r = two_group_batch(policy, task)
    pr = probe_for(policy, task, max_new_tokens=8)
    cfg = RREDCoTConfig(probe=mode, v0=v0, candidates=candidates)
    values = probe_values(r, pr, pr.segment(r, "lines"), cfg)
    for v, R, reward in zip(values, step_differences(values), r.rewards):
        assert ((v >= 0) & (v <= 1)).all()
        assert torch.isclose(R.sum(), reward - v[0], atol=1e-6)
        assert v[-1] == reward


@pytest.mark.parametrize("mode", ["additive", "replace", "weight"])
def test_one_segment_traces_get_exactly_grpo(policy, mode):
    task = ArithTask()
    r = two_group_batch(policy, task)
    spec = credit.get("rredcot")
    # one segment per trace: fixed segments longer than any completion
    cfg = spec.make_config({"mode": mode, "segmenter": {"name": "fixed", "n": 64}})
    adv = spec(r, probe_for(policy, task, max_new_tokens=8), cfg).advantages
    expected = grpo_advantages(r.rewards, r.group)[:, None] * r.completion_mask
    assert torch.allclose(adv, expected, atol=1e-6)


@pytest.mark.parametrize("mode", ["additive", "replace", "weight"])
def test_credit_is_zero_on_padding_and_finite(policy, mode):
    task = ArithTask()
    r = two_group_batch(policy, task)
    spec = credit.get("rredcot")
    out = spec(r, probe_for(policy, task, max_new_tokens=8), spec.make_config({"mode": mode}))
    assert (out.advantages[~r.completion_mask] == 0).all() and torch.isfinite(out.advantages).all()
    assert out.cost.tokens_generated == 0


def test_additive_mode_moves_credit_within_a_trace_and_keeps_its_mean(policy):
    task = ArithTask()
    r = two_group_batch(policy, task)
    spec = credit.get("rredcot")
    out = spec(r, probe_for(policy, task, max_new_tokens=8), spec.make_config({"lam": 0.5}))
    from credo.core.segment import segment_means
    seg_ids = probe_for(policy, task, max_new_tokens=8).segment(r, "lines")
    a_grpo = grpo_advantages(r.rewards, r.group)
    for i, means in enumerate(segment_means(out.advantages, seg_ids)):
        assert torch.isclose(means.mean(), a_grpo[i], atol=1e-5)


def test_cost_counter_matches_prefix_reuse_formula(policy):
    task = ArithTask()
    r = two_group_batch(policy, task).select([0, 1])  # one group, two 2-segment traces, candidates {85 (gold), 86}
    pr = probe_for(policy, task, max_new_tokens=8)
    spec = credit.get("rredcot")
    out = spec(r, pr, spec.make_config({"candidates": "answers"}))
    branch = len(policy.encode_continuation("?85", eos=True))
    # s_0 (the prompt) is shared by the group: 2 candidates once; s_1 differs per trace: 2 candidates each
    n_branches = 2 + 2 * 2
    trace_tokens = int(r.prompt_mask.sum() + r.completion_mask.sum())
    assert out.cost.tokens_scored == trace_tokens + n_branches * branch
    no_reuse = spec(r, pr, spec.make_config({"candidates": "answers", "reuse_prefix": False}))
    assert torch.allclose(no_reuse.advantages, out.advantages, atol=1e-5)
    assert no_reuse.cost.tokens_scored > out.cost.tokens_scored


def test_group_mean_v0_leaves_the_row_out(policy):
    task = ArithTask()
    r = two_group_batch(policy, task).select([0, 1, 2])  # one group, rewards 1, 0, 1
    pr = probe_for(policy, task, max_new_tokens=8)
    values = probe_values(r, pr, pr.segment(r, "lines"), RREDCoTConfig(v0="group_mean"))
    assert [float(v[0]) for v in values] == [0.5, 1.0, 0.5]  # the mean of the *other* members


def test_default_is_suffixes_and_uniform_groups_can_keep_grpo(policy):
    task = ArithTask()
    assert RREDCoTConfig().candidates == "suffixes"
    sub = two_group_batch(policy, task).select([0, 1, 2, 4, 5])  # group 0 mixed; rows 4, 5 of group 1 both wrong
    spec = credit.get("rredcot")
    # normalized: the random tiny model's absolute values are ~1e-30 and their differences vanish
    skip = spec(sub, probe_for(policy, task, max_new_tokens=8),
                 spec.make_config({"skip_uniform_groups": True, "probe": "normalized"})).advantages
    keep = spec(sub, probe_for(policy, task, max_new_tokens=8),
                 spec.make_config({"skip_uniform_groups": False, "probe": "normalized"})).advantages
    assert (skip[3:] == 0).all()  # the all-wrong group keeps GRPO's zero
    assert keep[3:].abs().sum() > 0  # otherwise the redistribution speaks there
    assert not torch.allclose(skip[:3], keep[:3])  # and z is taken over the live groups only
