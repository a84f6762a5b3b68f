"""credo.core.groups: the group operations every estimator and strategy shares."""

import pytest
import torch

from credo.core.groups import group_rows, mean_one, mixed_group_mask, zscore


def test_zscore_standardises_by_the_reference_and_guards_constant_signals():
    x = torch.tensor([1.0, 2.0, 4.0])
    z = zscore(x)
    assert abs(float(z.mean())) < 1e-6 and abs(float(z.std()) - 1) < 1e-6
    over = torch.tensor([0.0, 2.0])  # mean 1, sample std sqrt(2)
    assert torch.allclose(zscore(x, over=over), (x - 1) / 2 ** 0.5)
    assert torch.equal(zscore(torch.full((4,), 0.3)), torch.zeros(4))  # constant: no credit, not noise
    assert torch.equal(zscore(x, over=torch.tensor([5.0])), torch.zeros(3))  # one value: std undefined
    assert torch.equal(zscore(x, over=torch.tensor([1.0, 1.0 + 1e-9], dtype=torch.float64)), torch.zeros(3))


def test_group_rows_and_mixed_group_mask():
    group = torch.tensor([3, 1, 3, 1, 7])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    assert group_rows(group) == {3: [0, 2], 1: [1, 3], 7: [4]}
    assert mixed_group_mask(group, rewards).tolist() == [False, True, False]  # sorted ids 1, 3, 7


def test_mean_one_rescales_each_row_to_mean_one_over_its_mask():
    w = torch.tensor([[1.0, 3.0, 9.0], [0.0, 0.0, 5.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[True, True, False], [True, True, False], [False, False, False]])
    out = mean_one(w, mask)
    assert torch.equal(out[0], torch.tensor([0.5, 1.5, 0.0]))  # 0 off the mask, mean 1 on it
    assert torch.equal(out[1], torch.tensor([1.0, 1.0, 0.0]))  # a zero row: the mask itself
    assert torch.equal(out[2], torch.zeros(3))  # no tokens: zeros
    assert torch.equal(mean_one(w, mask, flat_at=None)[1], torch.zeros(3))  # unguarded: a zero row stays zero
    tiny = torch.tensor([[1e-13, 0.0]])  # mean 5e-14: above 0, not above 1e-12
    assert torch.equal(mean_one(tiny, torch.ones(1, 2)), tiny / 1e-8)
    assert torch.equal(mean_one(tiny, torch.ones(1, 2), floor=1e-12, flat_at=1e-12), torch.ones(1, 2))
    assert torch.equal(mean_one(w[0], mask[0].float(), flat_at=None), out[0])  # one row, [T]


def _bits(t):
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("trial", range(40))
def test_mean_one_is_bit_identical_to_each_estimators_former_renormalisation(trial):
    """rredcot's weight mode (guard mean > 0, floor 1e-8, zero rows -> mask), SC-GRPO's normalise (guard and
    floor 1e-12, zero rows -> ones on the mask) and OAR's per-row mass preservation (floor 1e-8, no guard)."""
    g = torch.Generator().manual_seed(trial)
    B, T = 1 + trial % 5, 1 + (7 * trial) % 37
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[0] = mask[0] & (trial % 3 != 0)  # an empty row now and then
    raw = torch.rand(B, T, generator=g) * 3 * [1.0, 1e-9, 1e-13, 0.0][trial % 4]
    raw[-1] = raw[-1] * (trial % 2)  # a zero row now and then
    m = mask.float()
    w = raw * m
    per_seq = w.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)
    rredcot = torch.where(per_seq > 0, w / per_seq.clamp(min=1e-8), m)
    assert torch.equal(_bits(mean_one(w, m)), _bits(rredcot))
    mean = (w * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    sc_grpo = torch.where(mean > 1e-12, w / mean.clamp(min=1e-12), torch.ones_like(w)) * mask
    assert torch.equal(_bits(mean_one(w, mask, floor=1e-12, flat_at=1e-12)), _bits(sc_grpo))
    for row in range(B):
        real = m[row]
        oar = raw[row] * real / ((raw[row] * real).sum() / real.sum().clamp(min=1)).clamp(min=1e-8)
        assert torch.equal(_bits(mean_one(raw[row], real, flat_at=None)), _bits(oar))


@pytest.mark.parametrize("scale", [1e20, 1e30, -1e35])
@pytest.mark.parametrize("std", ["sample", "population"])
def test_grpo_credit_from_huge_finite_rewards_is_the_scaled_credit_not_zero(scale, std):
    """(r - mean) / std is scale-free: rewards times 1e20 give the advantages of the 0/1 rewards. Before, the
    float32 squared deviations (1e40) were inf: every std inf and every advantage 0, with every check passing."""
    from credo.core.groups import grpo_advantages
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    plain = grpo_advantages(rewards, group, std=std)
    huge = grpo_advantages(rewards * scale, group, std=std)
    assert huge.dtype == torch.float32 and huge.abs().min() > 0.5
    torch.testing.assert_close(huge, plain * (1 if scale > 0 else -1), rtol=1e-5, atol=1e-5)


def test_a_reward_too_large_for_group_statistics_is_refused_by_row():
    from credo.credit.registry import NonFiniteReward, check_rewards
    from types import SimpleNamespace  # float64 rewards (a verl batch's may be): float32 cannot hold 3e120
    rollouts = SimpleNamespace(rewards=torch.tensor([1.0, 0.0, 3e120, 0.0], dtype=torch.float64), problems=[])
    with pytest.raises(NonFiniteReward, match=r"reward of row 2 is 3e\+120; 1 of 4 rewards exceed 1e\+100"):
        check_rewards(rollouts)
