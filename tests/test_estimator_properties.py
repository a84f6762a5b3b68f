"""Property tests (hypothesis) for every registered estimator on generated batches: finite credit,
exactly zero on padding, GRPO-family group sums zero, RREDCoT's redistribution telescopes, and
non-finite rewards refused before any estimator runs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import run_estimator, text_rollouts
from credo import credit
from credo.credit.registry import NonFiniteReward

LINES = ["37+48=85", "37+48=86", "12+13=25", "25+14=39", "#### 85", "#### 39", "#### 7", "9"]
PROPERTY = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

completion = st.lists(st.sampled_from(LINES), min_size=0, max_size=3).map("\n".join)
reward = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0, allow_nan=False))


@st.composite
def batches(draw):
    """(texts, rewards, groups): 1-2 groups of 2-4 rows, mixed lengths (so rows carry padding)."""
    sizes = draw(st.lists(st.integers(2, 4), min_size=1, max_size=2))
    groups = [g for g, n in enumerate(sizes) for _ in range(n)]
    texts = [draw(completion) for _ in groups]
    rewards = [draw(reward) for _ in groups]
    return texts, rewards, groups


@pytest.mark.parametrize("name", credit.names())
@PROPERTY
@given(batch=batches())
def test_credit_is_finite_and_exactly_zero_on_padding(name, batch):
    rollouts = text_rollouts(*batch)
    result = run_estimator(name, rollouts)
    mask = rollouts.completion_mask
    assert result.advantages.shape == mask.shape
    assert torch.isfinite(result.advantages).all()
    assert (result.advantages[~mask] == 0).all()
    if result.weights is not None:
        assert torch.isfinite(result.weights).all() and (result.weights[~mask] == 0).all()


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@PROPERTY
@given(batch=batches())
def test_grpo_family_advantages_sum_to_zero_in_each_group(name, batch):
    rollouts = text_rollouts(*batch)
    per_row = run_estimator(name, rollouts).advantages[:, 0]  # sequence-level: every real token of a row carries it
    for g in rollouts.group.unique():
        assert abs(float(per_row[rollouts.group == g].sum())) < 1e-4


@PROPERTY
@given(batch=batches(), v0=st.sampled_from(["probe", "group_mean"]))
def test_rredcot_redistribution_telescopes(batch, v0):
    """sum_k R_{i,k} = r_i - V(s_0): V(s_0) is the mean reward of the row's *other* group members
    (v0=group_mean, leave-one-out) or the probe's value of the bare prompt, which is one number per
    group (every row shares the prompt and the candidates: the group's completions and the reference)."""
    rollouts = text_rollouts(*batch)
    R = run_estimator("rredcot", rollouts, v0=v0).segment_credit
    start_values = rollouts.rewards - torch.stack([r.sum() for r in R])
    segmented = torch.tensor([len(r) > 0 for r in R])  # a row with no segment has only its outcome
    for g in rollouts.group.unique():
        in_group = (rollouts.group == g) & segmented
        values = start_values[in_group]
        if v0 == "probe" and values.numel():
            assert float(values.max() - values.min()) < 1e-5
        for row in in_group.nonzero().flatten().tolist():
            others = (rollouts.group == g) & (torch.arange(len(R)) != row)
            if v0 == "group_mean" and others.any():
                assert abs(float(start_values[row] - rollouts.rewards[others].mean())) < 1e-5


@pytest.mark.parametrize("name", credit.names())
@PROPERTY
@given(batch=batches(), bad=st.sampled_from([math.nan, math.inf, -math.inf]), data=st.data())
def test_non_finite_rewards_are_refused_naming_the_row(name, batch, bad, data):
    texts, rewards, groups = batch
    row = data.draw(st.integers(0, len(rewards) - 1))
    rewards = list(rewards)
    rewards[row] = bad
    with pytest.raises(NonFiniteReward, match=rf"reward of row {row} \(problem '[^']+'\) is {bad}"):
        run_estimator(name, text_rollouts(texts, rewards, groups))
