"""credo.core.groups: the group operations every estimator and strategy shares."""

import torch

from credo.core.groups import group_rows, mixed_groups, zscore


def test_zscore_standardises_by_the_reference_and_guards_constant_signals():
    x = torch.tensor([1.0, 2.0, 4.0])
    z = zscore(x)
    assert abs(float(z.mean())) < 1e-6 and abs(float(z.std()) - 1) < 1e-6
    over = torch.tensor([0.0, 2.0])  # mean 1, sample std sqrt(2)
    assert torch.allclose(zscore(x, over=over), (x - 1) / 2 ** 0.5)
    assert torch.equal(zscore(torch.full((4,), 0.3)), torch.zeros(4))  # constant: no credit, not noise
    assert torch.equal(zscore(x, over=torch.tensor([5.0])), torch.zeros(3))  # one value: std undefined
    assert torch.equal(zscore(x, over=torch.tensor([1.0, 1.0 + 1e-9], dtype=torch.float64)), torch.zeros(3))


def test_group_rows_and_mixed_groups():
    group = torch.tensor([3, 1, 3, 1, 7])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    assert group_rows(group) == {3: [0, 2], 1: [1, 3], 7: [4]}
    assert mixed_groups(group, rewards).tolist() == [False, True, False]  # sorted ids 1, 3, 7
