"""The masked-perturbation invariance check (credo.integrations.leak_check, re-exported by credo.checks): every
registered estimator passes it on a batch with padding; each class of leak it is there for, planted in a toy
estimator (padding summed into a sequence advantage, placeholder rows in a group's baseline, a masked value
bootstrapping a valid token), fails it naming the row and the token; the same toys written correctly pass; and the
check consumes neither the trainer's random stream nor the probe's (it rewinds the probe to where the run left it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from builders import CHEAP, PROPERTY_POLICY, PROPERTY_TASK, text_rollouts
from credo import credit
from credo.core.probe import Probe
from credo.core.segment import segmentation_stage
from credo.integrations import checks
from credo.integrations.checks import CreditCheckError, Where
from credo.integrations.leak_check import (LEAK_SCALE, MaskedInputs, check_estimator_invariance,
                                           check_masked_invariance, perturbed, rollout_inputs)
from credo.core.protocols import SamplingConfig

TEXTS = ["37+48=85\n#### 85", "37+48=86", "", "12+13=25\n25+14=39\n#### 39", "#### 7", "9\n#### 39"]
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.3, 0.0]
GROUPS = [0, 0, 0, 1, 1, 1]
WHERE = Where(step=3, off="leak_check=False")


def rollouts():
    """6 rows in 2 groups of 3, completions of 0 to 5 lines: every row but the longest has padding."""
    return text_rollouts(TEXTS, REWARDS, GROUPS)


def probe(seed=0):
    return Probe(PROPERTY_POLICY, PROPERTY_TASK, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", credit.names())
def test_every_registered_estimator_passes_the_check(name):
    spec, p = credit.get(name), probe()
    config = spec.make_config(CHEAP.get(name, {}))
    r, _ = segmentation_stage(rollouts(), p, spec.reads_batch_segments(config))
    assert (~r.completion_mask).sum() > 10  # padding to refill
    check_estimator_invariance(spec, r, p, config, WHERE)


def test_the_refill_reaches_every_padding_position_of_every_input_and_no_real_one():
    r, _ = segmentation_stage(rollouts(), probe(), True)
    inputs = rollout_inputs(r)
    assert set(inputs.tensors) == {"completion_ids", "old_logprobs", "segment_ids"}
    out = perturbed(inputs, torch.Generator().manual_seed(0))
    pad = ~r.completion_mask
    for name, before in inputs.tensors.items():
        assert torch.equal(out[name][~pad], before[~pad]), name
        assert (out[name][pad] != before[pad]).float().mean() > 0.9, name
    assert out["old_logprobs"][pad].abs().max() > LEAK_SCALE / 2  # large, as the docstring says
    assert int(out["completion_ids"].max()) <= int(r.completion_ids.max())  # ids any backend reads


def test_a_real_estimator_reading_padding_fails_the_check_naming_row_and_token():
    """grpo with the padding's old log-probs planted in its advantage (a sequence mean over all T positions)."""
    spec = credit.get("grpo")

    def leaky(r, p, config):
        result = spec.fn(r, p, config)
        mean_all = r.old_logprobs.mean(1, keepdim=True)  # the bug: padding counted
        return dataclasses.replace(result, advantages=result.advantages + 1e-3 * mean_all * r.completion_mask)

    r = rollouts()
    with pytest.raises(CreditCheckError, match=r"credo check masked_invariance failed at step 3, row 0: refilling "
                                               r"the masked positions of completion_ids, old_logprobs with random "
                                               r"values moved the advantage of valid token 0 .*leaks"):
        check_estimator_invariance(dataclasses.replace(spec, fn=leaky), r, None, spec.make_config(), WHERE)


# --- toy estimators, each with one leak of the list planted, and the same written right ------------------
def sequence_advantages(inputs, leak):
    """GSPO-like: one advantage per row, the mean of its token rewards[B, T] minus the group's mean of those."""
    rewards, valid = inputs["token_rewards"], VALID
    per_row = rewards.mean(1) if leak else (rewards * valid).sum(1) / valid.sum(1)
    baseline = torch.stack([per_row[GROUP_IDS == g].mean() for g in GROUP_IDS])
    return (per_row - baseline)[:, None] * valid


def group_baseline_advantages(inputs, leak):
    """GRPO with placeholder rows (ROW_VALID False): baseline = the group's mean reward."""
    rewards = inputs["rewards"]
    counted = torch.ones_like(ROW_VALID) if leak else ROW_VALID
    baseline = torch.stack([rewards[(GROUP_IDS == g) & counted].mean() for g in GROUP_IDS])
    return (rewards - baseline)[:, None] * VALID * ROW_VALID[:, None]


def bootstrapped_advantages(inputs, leak, gamma=0.9):
    """One-step TD: A_t = r_t + gamma V_{t+1} - V_t over values[B, T]; the value after a row's last token is
    padding: 0 when read right, the masked value when leaked."""
    values, rewards = inputs["values"], inputs["token_rewards"]
    following = torch.cat([values[:, 1:], torch.zeros(len(values), 1)], 1)
    if not leak:
        following = following * torch.cat([VALID[:, 1:], torch.zeros(len(values), 1)], 1)
    return (rewards + gamma * following - values) * VALID


B, T = 6, 8
GROUP_IDS = torch.tensor([0, 0, 0, 1, 1, 1])
VALID = torch.arange(T)[None, :] < torch.tensor([8, 5, 3, 6, 1, 7])[:, None]
ROW_VALID = torch.tensor([True, True, False, True, True, False])  # one placeholder row in each group


def toy_inputs():
    g = torch.Generator().manual_seed(0)
    token_rewards = torch.rand(B, T, generator=g) * VALID
    return {"token_rewards": token_rewards, "values": torch.rand(B, T, generator=g) * VALID,
            "rewards": torch.rand(B, generator=g)}


TOYS = {"padding summed into a sequence advantage": (sequence_advantages, ("token_rewards",), False),
        "placeholder rows in a group baseline": (group_baseline_advantages, ("rewards",), True),
        "a masked value bootstrapping a valid token": (bootstrapped_advantages, ("values", "token_rewards"), False)}


@pytest.mark.parametrize("bug", list(TOYS))
def test_each_planted_leak_is_caught_and_the_correct_estimator_passes(bug):
    fn, names, placeholders = TOYS[bug]
    data = toy_inputs()
    inputs = MaskedInputs({k: data[k] for k in names}, VALID, ROW_VALID if placeholders else None)
    check_masked_invariance(lambda t: fn(t, leak=False), inputs, WHERE)
    with pytest.raises(CreditCheckError, match=r"credo check masked_invariance failed at step 3, row \d: .*valid "
                                               r"token \d+ from .* to .*leaks"):
        check_masked_invariance(lambda t: fn(t, leak=True), inputs, WHERE)


def test_a_placeholder_row_itself_is_not_compared():
    """Only valid rows' tokens count: an estimator that leaves garbage on a placeholder row passes."""
    data = toy_inputs()
    inputs = MaskedInputs({"rewards": data["rewards"]}, VALID, ROW_VALID)

    def garbage_on_placeholders(t):
        return group_baseline_advantages(t, leak=False) + t["rewards"][:, None] * ~ROW_VALID[:, None]

    check_masked_invariance(garbage_on_placeholders, inputs, WHERE)


def test_the_check_leaves_the_global_and_the_probe_random_streams_where_the_run_left_them():
    spec = credit.get("vineppo")  # samples continuations from the probe's generator
    config = spec.make_config(CHEAP["vineppo"])
    r, _ = segmentation_stage(rollouts(), probe(), True)
    p = probe()
    state = p.generator.get_state()
    first = spec(r, p, config)
    after_run = p.generator.get_state()
    torch.manual_seed(5)
    global_state = torch.get_rng_state()
    check_estimator_invariance(spec, r, p, config, WHERE, before=first.advantages, generator_state=state)
    assert torch.equal(p.generator.get_state(), after_run)
    assert torch.equal(torch.get_rng_state(), global_state)


def test_reachable_as_credo_checks():
    import credo
    assert credo.checks.check_masked_invariance is check_masked_invariance is checks.check_masked_invariance
