"""Sampling when credo's CPU generator and the model's logits live on different devices (TRL, verl on a GPU).

torch.multinomial refuses a generator on another device; pick_tokens then draws by the inverse CDF with one
uniform per row from the generator. These tests check that path's distribution on the CPU (the device
switch itself needs a second device to run)."""

import torch

from credo.policy.base import sample_by_inverse_cdf


def test_inverse_cdf_sampling_draws_each_token_with_its_probability_and_never_a_zero_one():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3, 0.0]]).repeat(40_000, 1) * 0.5  # unnormalised rows (top-p) allowed
    tokens = sample_by_inverse_cdf(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert freq[1] == 0 and freq[4] == 0  # zero-probability tokens, including the last one
    # standard error of a frequency near 0.6 over 40k draws: 0.0025; 4 of them
    assert (freq - torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0])).abs().max() < 0.01


def test_inverse_cdf_sampling_is_seeded_by_the_generator_and_rowwise():
    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(1)), -1)
    a = sample_by_inverse_cdf(probs, torch.Generator().manual_seed(3))
    b = sample_by_inverse_cdf(probs, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (6,)
    one_hot = torch.zeros(3, 50)
    one_hot[torch.arange(3), torch.tensor([7, 0, 49])] = 1.0
    assert sample_by_inverse_cdf(one_hot, torch.Generator().manual_seed(0)).tolist() == [7, 0, 49]
