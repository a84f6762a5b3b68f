import pytest
import torch

from builders import padded_rollouts
from credo import credit
from credo.core.config import ConfigError
from credo.core.groups import grpo_advantages, rloo_advantages


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_advantages_sum_to_zero_and_vanish_on_padding(name):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (24,), generator=g).float().tolist()
    group = torch.arange(4).repeat_interleave(6).tolist()
    lengths = torch.randint(1, 7, (24,), generator=g).tolist()
    r = padded_rollouts(rewards, group, lengths)
    adv = credit.get(name)(r).advantages
    assert (adv[~r.completion_mask] == 0).all()
    seq = adv.sum(1) / r.completion_mask.sum(1)  # the broadcast sequence advantage
    for gid in range(4):
        assert abs(float(seq[r.group == gid].sum())) < 1e-5
    assert seq.abs().sum() > 0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_equal_rewards_give_zero_advantage(name):
    r = padded_rollouts([1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1], [3] * 6)
    assert credit.get(name)(r).advantages.abs().max() == 0


def test_grpo_matches_formula_sample_and_population_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    group = torch.zeros(5, dtype=torch.long)
    a = grpo_advantages(rewards, group, eps=0.0)
    assert torch.allclose(a, (rewards - rewards.mean()) / rewards.std(unbiased=True))
    a = grpo_advantages(rewards, group, std="population", eps=0.0)
    assert torch.allclose(a, (rewards - rewards.mean()) / rewards.std(unbiased=False))


def test_rloo_is_leave_one_out():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    a = rloo_advantages(rewards, torch.zeros(4, dtype=torch.long))
    expected = torch.tensor([1 - 0.5 / 3, 0 - 1.5 / 3, 0.5 - 1 / 3, 0 - 1.5 / 3])
    assert torch.allclose(a, expected)


def test_loss_mask_excludes_tokens_from_credit():
    r = padded_rollouts([1, 0], [0, 0], [4, 4])
    r = r.with_fields(loss_mask=torch.tensor([[False, False, True, True, True, True]] * 2))
    adv = credit.get("grpo")(r).advantages
    assert (adv[:, :2] == 0).all() and (adv[:, 2:4] != 0).all()


def test_unknown_estimator_and_bad_option_name_the_problem():
    with pytest.raises(ConfigError, match="unknown credit estimator 'nope'"):
        credit.get("nope")
    with pytest.raises(ValueError, match="credit.std"):
        credit.get("grpo").make_config({"std": "bogus"})
    with pytest.raises(ValueError, match="credit.lam"):
        credit.get("grpo").make_config({"lam": 1})
