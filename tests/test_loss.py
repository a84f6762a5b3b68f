import pytest
import torch

from credo.core.loss import LossConfig, aggregate, k3_kl, policy_loss


def test_unclipped_loss_at_ratio_one_is_minus_mean_advantage():
    lp = torch.randn(3, 5)
    adv = torch.randn(3, 5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    loss, stats = policy_loss(lp, lp.clone(), adv, mask, LossConfig(), norm_length=5)
    per_seq = [(-adv[i][mask[i]]).mean() for i in range(3)]
    assert torch.allclose(loss, torch.stack(per_seq).mean())
    assert stats["clip_frac"] == 0


def test_clipping_stops_gradient_beyond_the_range():
    old = torch.zeros(1, 2)
    lp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_()
    adv = torch.ones(1, 2)
    loss, stats = policy_loss(lp, old, adv, torch.ones(1, 2, dtype=torch.bool), LossConfig(eps_high=0.2), norm_length=2)
    loss.backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] != 0
    assert stats["clip_frac"] == 0.5


def test_aggregation_modes():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    assert aggregate(x, m, "seq-mean-token-mean", 4) == pytest.approx(2.5)
    assert aggregate(x, m, "token-mean", 4) == pytest.approx(8 / 5)
    assert aggregate(x, m, "seq-mean-token-sum-norm", 10) == pytest.approx(8 / 20)


def test_sequence_ratio_is_geometric_mean_of_token_ratios():
    old = torch.zeros(1, 3)
    lp = torch.tensor([[0.1, -0.2, 0.4]], requires_grad=True)
    cfg = LossConfig(ratio="sequence", eps_low=10.0 - 9.5, eps_high=10.0)
    loss, stats = policy_loss(lp, old, torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), cfg, norm_length=3)
    s = torch.exp(torch.tensor(0.3 / 3))
    assert float(loss) == pytest.approx(-float(s), rel=1e-5)  # -s * A, unclipped
    loss.backward()
    # d/d lp_t of -s*A (seq-mean-token-mean) = -s/|o| for every token
    assert torch.allclose(lp.grad, -s / 3 * torch.ones(1, 3), atol=1e-6)


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere():
    lp = torch.randn(4, 4)
    assert torch.allclose(k3_kl(lp, lp), torch.zeros(4, 4))
    assert (k3_kl(lp, lp + 0.3) > 0).all()


def test_weights_scale_per_token_loss():
    lp = torch.zeros(1, 2)
    w = torch.tensor([[0.0, 2.0]])
    loss, _ = policy_loss(lp, lp, torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), LossConfig(), 2, weights=w)
    assert loss == pytest.approx(-1.0)
