"""credo_* estimators with verl's signature. verl itself needs ray and GPU-side packages that do not
install on this CPU machine, so its GRPO is re-stated here from verl 0.9.1's core_algos (a per-uid
loop: mean/std with torch.std, a group of one gets mean 0 / std 1) and compared against."""

import inspect
from collections import defaultdict

import numpy as np
import pytest
import torch

from credo.integrations.verl import make_verl_estimator


def verl_grpo_reference(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    scores = token_level_rewards.sum(dim=-1).clone()
    groups = defaultdict(list)
    for i in range(len(scores)):
        groups[index[i]].append(scores[i])
    mean, std = {}, {}
    for k, v in groups.items():
        mean[k], std[k] = (torch.tensor(0.0), torch.tensor(1.0)) if len(v) == 1 else (torch.stack(v).mean(), torch.stack(v).std())
    for i in range(len(scores)):
        scores[i] = (scores[i] - mean[index[i]]) / (std[index[i]] + epsilon) if norm_adv_by_std_in_grpo else scores[i] - mean[index[i]]
    return scores[:, None] * response_mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("norm", [True, False])
def test_credo_grpo_equals_verl_grpo_on_random_batches(seed, norm):
    g = torch.Generator().manual_seed(seed)
    B, T = 24, 7
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), torch.randint(0, T, (B,), generator=g)] = torch.randint(0, 2, (B,), generator=g).float()
    index = np.array([f"uid-{i}" for i in torch.randint(0, 7, (B,), generator=g).tolist()], dtype=object)
    fn = make_verl_estimator("grpo" if norm else "dr_grpo")
    adv, ret = fn(token_level_rewards=rewards, response_mask=mask, index=index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm,
                  config=None)
    expected = verl_grpo_reference(rewards, mask, index, 1e-6, norm)
    assert torch.allclose(adv, expected, atol=1e-5) and torch.equal(adv, ret)


def test_signature_contract_and_model_estimators_refused():
    params = list(inspect.signature(make_verl_estimator("rloo")).parameters)
    assert params[:6] == ["token_level_rewards", "response_mask", "index", "epsilon", "norm_adv_by_std_in_grpo", "config"]
    with pytest.raises(ValueError, match="needs the model"):
        make_verl_estimator("rredcot")
