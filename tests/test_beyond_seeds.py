"""The free and cheap estimators (tempo, lambda_grpo, entropy_mask, gtpo, otb, prefix_shaping): one test per
promised property, the privileged marks, the audit's weight columns, and 2 deterministic training steps."""

from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import (PROPERTY_POLICY, PROPERTY_TASK, dapo_config, run_estimator, strip_time, text_rollouts,
                      token_rollouts)
from credo import credit
from credo.lab.audit.report import weight_concentration
from credo.cli.main import main
from credo.credit.entropy import gtpo_paper_advantages, high_entropy_mask
from credo.core.groups import grpo_advantages
from credo.credit.otb import otb_advantages, sampled_token_statistics
from credo.credit.prefix_shaping import positive_credit, shape_prefixes
from credo.credit.tree import prefix_values, segment_changes, value_changes
from credo.train.methods import privileged
from credo.core.protocols import SamplingConfig
from credo.core.probe import Probe
from credo.core.segment import segment_bounds, segment_means
from credo.strategies import LOCALISERS
from credo.strategies.localisers import localise
from credo.train.trainer import Trainer

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
TEXTS = ["37+48=85\n#### 85", "37+48=86\n#### 86", "37+48=85\n#### 86", "12+13=25\n25+14=39\n#### 39",
         "12+13=25\n25+14=38\n#### 38", "#### 7"]


@st.composite
def token_groups(draw):
    """(ids[B, T], mask[B, T] right-padded, group[B], rewards[B]): 1-3 groups of 1-5 rows over a 3-token
    vocabulary, so prefixes are often shared and trees branch at many depths."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    group = [g for g, n in enumerate(sizes) for _ in range(n)]
    T = draw(st.integers(1, 6))
    rows = [draw(st.lists(st.integers(0, 2), min_size=0, max_size=T)) for _ in group]
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows])
    rewards = torch.tensor([draw(st.sampled_from([0.0, 0.25, 1.0])) for _ in group])
    return ids, mask, torch.tensor(group), rewards


@PROPERTY
@given(batch=token_groups())
def test_tree_values_equal_the_brute_force_mean_over_descendants(batch):
    ids, mask, group, rewards = batch
    values, counts = prefix_values(token_rollouts(*batch))
    for i in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            if not mask[i, t]:
                assert values[i, t] == 0 and counts[i, t] == 0
                continue
            sharing = [j for j in range(ids.shape[0]) if group[j] == group[i] and mask[j, t]
                       and torch.equal(ids[j, :t + 1], ids[i, :t + 1])]
            assert counts[i, t] == len(sharing)
            assert abs(float(values[i, t]) - float(rewards[sharing].mean())) < 1e-6


@PROPERTY
@given(batch=token_groups())
def test_tempo_changes_telescope_and_vanish_where_the_tree_does_not_branch(batch):
    ids, mask, group, rewards = batch
    values, counts = prefix_values(token_rollouts(*batch))
    mean = torch.stack([rewards[group == g].mean() for g in group.tolist()])
    change = value_changes(values, mask, mean)
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        if n:  # the changes of a row sum to its last token's value minus the group mean
            assert abs(float(change[i].sum()) - float(values[i, n - 1] - mean[i])) < 1e-5
        for t in range(n):  # no branch (the same members as one token earlier): no change
            same = counts[i, t] == (counts[i, t - 1] if t else (group == group[i]).sum())
            if same:
                assert change[i, t] == 0


def test_tempo_without_its_td_term_is_grpo_and_shared_tokens_carry_the_group_baseline_only():
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    grpo = run_estimator("grpo", r).advantages
    assert torch.allclose(run_estimator("tempo", r, lam=0.0).advantages, grpo)
    tempo = run_estimator("tempo", r).advantages
    _, counts = prefix_values(r)
    shared_by_all = (counts == 3) & r.completion_mask  # group size 3: the tokens every member shares
    assert shared_by_all.any() and torch.allclose(tempo[shared_by_all], grpo[shared_by_all])
    assert not torch.allclose(tempo, grpo)  # the branch points move credit


def test_lambda_grpo_weights_a_prefix_shared_by_n_members_by_one_over_n():
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    result = run_estimator("lambda_grpo", r)
    _, counts = prefix_values(r)
    m = r.completion_mask
    assert torch.allclose(result.weights[m], 1 / counts[m]) and (result.weights[~m] == 0).all()
    assert torch.allclose(result.advantages, run_estimator("grpo", r).advantages)
    assert torch.allclose(run_estimator("lambda_grpo", r, lam=0.0).weights, m.float())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(1, 60), q=st.sampled_from([0.125, 0.25, 0.5, 0.75]), seed=st.integers(0, 10_000))
def test_entropy_mask_keeps_exactly_the_top_q_of_valid_tokens(n, q, seed):
    g = torch.Generator().manual_seed(seed)
    entropies = torch.randperm(4 * n, generator=g).float().reshape(4, n) / 7  # distinct values
    mask = torch.rand(4, n, generator=g) < 0.7
    keep = high_entropy_mask(entropies, mask, q)
    valid = entropies[mask]
    assert not (keep & ~mask).any()
    if valid.numel() == 0:
        assert not keep.any()
        return
    # torch.quantile's linear rule (TRL's): the values >= the (1 - q) quantile are the top N - ceil((1 - q)(N - 1))
    expected = valid.numel() - math.ceil((1 - q) * (valid.numel() - 1))
    assert int(keep.sum()) == expected
    if (mask & ~keep).any():
        assert float(entropies[keep].min()) > float(entropies[mask & ~keep].max())


@pytest.mark.parametrize("seed", range(4))
def test_entropy_mask_equals_trls_get_high_entropy_mask(seed):
    from trl import GRPOTrainer
    g = torch.Generator().manual_seed(seed)
    entropies = torch.rand(6, 17, generator=g) * 3
    mask = torch.rand(6, 17, generator=g) < 0.8
    accelerator = types.SimpleNamespace(pad_across_processes=lambda x, dim, pad_index: x, gather=lambda x: x)
    trl_mask = GRPOTrainer.get_high_entropy_mask(types.SimpleNamespace(accelerator=accelerator), entropies,
                                                 mask.int(), 1 - 0.2)
    assert torch.equal(high_entropy_mask(entropies, mask, 0.2), trl_mask)


def test_entropy_mask_estimator_weights_grpo_by_the_mask_of_the_policys_entropies():
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    result = run_estimator("entropy_mask", r)
    _, entropies = PROPERTY_POLICY.score(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, entropy=True)
    assert torch.equal(result.weights.bool(), high_entropy_mask(entropies, r.completion_mask, 0.2))
    assert torch.allclose(result.advantages, run_estimator("grpo", r).advantages)
    assert result.cost.tokens_scored > 0


def test_gtpo_weights_follow_the_entropy_shares_at_each_position():
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    result = run_estimator("gtpo", r, form="weights", a1=1.0, a2=0.5)
    _, H = PROPERTY_POLICY.score(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, entropy=True)
    m = r.completion_mask
    # group 0: row 0 above the mean (O+ alone: share 1), rows 1, 2 below (O-: shares of 1/H at each position)
    assert torch.allclose(result.weights[0][m[0]], torch.full((int(m[0].sum()),), 1.5))
    t = 0
    inv = 1 / H[[1, 2], t]
    assert torch.allclose(result.weights[[1, 2], t], 1 + 0.5 * 2 * inv / inv.sum())
    assert (result.weights[~m] == 0).all()
    assert torch.allclose(run_estimator("gtpo", r, form="weights", a2=0.0).weights, m.float())


def test_gtpo_paper_form_is_the_shaped_rewards_of_each_set_standardised_apart():
    """form=paper, computed here by hand from the paper's equations on entropies that vary: group 0 (one right,
    two wrong of different lengths) and an all-wrong group 1, which the paper credits through its O- entropy term
    (the weight form gives it 0)."""
    gen = torch.Generator().manual_seed(0)
    H = torch.rand(6, 5, generator=gen, dtype=torch.float64) * 3
    m = torch.ones(6, 5, dtype=torch.bool)
    m[2, 3:] = False
    m[5, 2:] = False
    H = H * m
    rewards, group = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 1, 1, 1])
    expected = torch.zeros_like(H)
    for rows, positive in (([0], True), ([1, 2], False), ([3, 4, 5], False)):
        shaped = {}
        for i in rows:
            for t in range(int(m[i].sum())):
                live = [k for k in rows if m[k, t]]
                score = (lambda k: H[k, t]) if positive else (lambda k: 1 / (H[k, t] + 1e-8))
                share = len(live) * score(i) / sum(score(k) for k in live)
                shaped[i, t] = 1.0 + 0.1 * share if positive else -(1.0 + 0.1 * share)
        values = torch.tensor(list(shaped.values()), dtype=torch.float64)
        mean, std = values.mean(), ((values - values.mean()) ** 2).mean().add(1e-8).sqrt()
        for (i, t), v in shaped.items():
            expected[i, t] = (v - mean) / std
    config = credit.get("gtpo").make_config({"form": "paper", "a1": 1.0, "a2": 0.1})
    direct = gtpo_paper_advantages(H.float(), m, group, rewards, config)
    assert torch.allclose(direct.double(), expected, atol=1e-5)
    assert (direct[3:][m[3:]].abs() > 0.1).any()  # the all-wrong group is credited, about zero mean
    assert abs(float(direct[3:][m[3:]].mean())) < 1e-5 and (direct[0] == 0).all()  # one O+ row: constant, 0
    # the estimator: the same advantages, no token weights; the weight form leaves the all-wrong group at 0
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    result = run_estimator("gtpo", r)  # the paper's form is the default
    assert result.weights is None and (result.advantages[~r.completion_mask] == 0).all()
    assert (result.advantages[3:][r.completion_mask[3:]] != 0).any()
    assert (run_estimator("gtpo", r, form="weights").advantages[3:] == 0).all()


@pytest.mark.parametrize("seed", range(5))
def test_otb_equals_verls_optimal_token_baseline(seed):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    g = torch.Generator().manual_seed(seed)
    B, T = 12, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = torch.randint(0, 2, (B,), generator=g).float()
    if seed % 2:  # dense rewards too: OTB's returns are reward-to-go
        rewards = rewards + torch.rand(B, T, generator=g) * mask * 0.1
    index = [f"p{k}" for k in torch.randint(0, 4, (B,), generator=g).tolist()]
    logprobs = -torch.rand(B, T, generator=g) * 3
    squares = torch.rand(B, T, generator=g)
    expected, _ = core_algos.compute_optimal_token_baseline_advantage(rewards, mask, index, logprobs, squares)
    group = torch.tensor([int(k[1:]) for k in index])
    ours = otb_advantages(rewards, mask, group, logprobs, squares)
    assert torch.allclose(ours, expected, atol=1e-6)
    no_tail, _ = core_algos.compute_optimal_token_baseline_advantage(rewards, mask, index, logprobs, squares,
                                                                     handle_zero_tail=False)
    assert torch.allclose(otb_advantages(rewards, mask, group, logprobs, squares, handle_zero_tail=False), no_tail,
                          atol=1e-6)


def test_otb_estimator_feeds_verl_the_policys_own_probabilities():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    result = run_estimator("otb", r)
    probe = Probe(PROPERTY_POLICY, PROPERTY_TASK, SamplingConfig(), torch.Generator())
    logprobs, squares = sampled_token_statistics(r, probe, 2)
    assert torch.allclose(logprobs, r.old_logprobs, atol=1e-5)  # the sampler's own log-probs, re-scored
    mask = r.completion_mask.float()
    token_rewards = torch.zeros(mask.shape)
    token_rewards[torch.arange(6), r.completion_mask.sum(1) - 1] = r.rewards
    expected, _ = core_algos.compute_optimal_token_baseline_advantage(token_rewards, mask, r.group.numpy(),
                                                                      logprobs, squares)
    assert torch.allclose(result.advantages, expected, atol=1e-6)


@PROPERTY
@given(batch=token_groups(), data=st.data())
def test_tempo_segment_changes_are_the_sums_of_the_token_changes_inside_each_segment(batch, data):
    ids, mask, group, rewards = batch
    values, _ = prefix_values(token_rollouts(*batch))
    mean = torch.stack([rewards[group == g].mean() for g in group.tolist()])
    token_change = value_changes(values, mask, mean)
    # each row's valid tokens cut into consecutive segments at random boundaries (-1 on padding)
    segment_ids = torch.full(ids.shape, -1)
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        cuts = data.draw(st.lists(st.booleans(), min_size=max(n - 1, 0), max_size=max(n - 1, 0)))
        segment_ids[i, :n] = torch.tensor([0] + cuts, dtype=torch.long)[:n].cumsum(0) if n else segment_ids[i, :0]
    changes = segment_changes(values, segment_ids, mean)
    for i, bounds in enumerate(segment_bounds(segment_ids)):
        assert len(changes[i]) == len(bounds)
        for k, (a, b) in enumerate(bounds):
            assert abs(float(changes[i][k]) - float(token_change[i, a:b].sum())) < 1e-5


def test_tempo_reads_the_batch_segments_only_at_segments():
    spec = credit.get("tempo")
    assert spec.reads_batch_segments(spec.make_config({"at": "segments"}))
    assert not spec.reads_batch_segments(spec.make_config({"at": "tokens"}))
    assert not spec.reads_batch_segments(spec.make_config({"at": "segments", "segmenter": "lines"}))


@PROPERTY
@given(batch=token_groups(), data=st.data())
def test_prefix_shaping_leaves_the_prefix_credit_untouched_and_padding_zero(batch, data):
    ids, mask, group, rewards = batch
    adv = grpo_advantages(rewards, group)
    prefix = positive_credit(adv, group)
    starts = {i: data.draw(st.integers(0, ids.shape[1])) for i in range(len(group)) if data.draw(st.booleans())}
    out = shape_prefixes(adv, mask, starts, prefix)
    assert (out[~mask] == 0).all()
    for i in range(len(group)):
        cut = starts.get(i, 0)
        assert (out[i, :cut][mask[i, :cut]] == prefix[i]).all()
        assert (out[i, cut:][mask[i, cut:]] == adv[i]).all()
        positives = adv[(group == group[i]) & (adv > 0)]
        assert abs(float(prefix[i]) - (float(positives.mean()) if positives.numel() else 0.0)) < 1e-6


def test_prefix_shaping_with_the_oracle_credits_a_wrong_traces_verified_prefix_positively():
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    probe = Probe(PROPERTY_POLICY, PROPERTY_TASK, SamplingConfig(), torch.Generator())
    r = r.with_fields(correct=r.rewards > 0.5, segment_ids=probe.segment(r, "lines"))
    result = run_estimator("prefix_shaping", r, localiser="oracle")
    grpo = run_estimator("grpo", r).advantages
    bounds = segment_bounds(r.segment_ids)
    # row 2 "37+48=85 / #### 86": the first line is right, the answer line is its first error
    cut = bounds[2][1][0]
    assert torch.allclose(result.advantages[2, :cut], grpo[0, :cut])  # the group's positive credit (row 0's)
    assert torch.allclose(result.advantages[2, cut:], grpo[2, cut:])
    # row 4 "12+13=25 / 25+14=38 / #### 38": the second line is its first error
    cut = bounds[4][1][0]
    assert (result.advantages[4, :cut] > 0).all() and torch.allclose(result.advantages[4, cut:], grpo[4, cut:])
    for row in (0, 1, 3, 5):  # correct rows and a wrong row whose first step is its first error keep GRPO's
        assert torch.allclose(result.advantages[row], grpo[row])
    assert (result.advantages[~r.completion_mask] == 0).all()


def test_credit_localiser_picks_the_estimators_most_negative_segment():
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    probe = Probe(PROPERTY_POLICY, PROPERTY_TASK, SamplingConfig(), torch.Generator())
    segments = probe.segment(r, "lines")
    rows = [1, 2, 4, 5]
    picks = localise("credit", r, rows, probe, segments, None, credit_method="tempo:at=segments")
    means = segment_means(run_estimator("tempo", r.with_fields(segment_ids=segments),
                                        at="segments").advantages, segments)
    assert picks == [int(torch.argmin(means[i])) for i in rows]
    assert picks[1] == 1 and picks[2] == 1  # the answer line of row 2, the wrong second line of row 4


def test_the_credit_localiser_runs_its_estimators_collectives_on_a_shard_with_no_failed_trace():
    """Every data-parallel shard must call Probe.gather as often as the others: a shard with no failed trace
    (or, in prefix shaping, no row to shape) runs the credit localiser's estimator too."""
    r = text_rollouts(TEXTS, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])

    def gathers(run) -> int:
        calls = []
        probe = Probe(PROPERTY_POLICY, PROPERTY_TASK, SamplingConfig(), torch.Generator(),
                      gather=lambda values: calls.append(values.numel()) or values)
        run(probe)
        return len(calls)

    segments = Probe(PROPERTY_POLICY, PROPERTY_TASK, SamplingConfig(), torch.Generator()).segment(r, "lines")
    some = gathers(lambda p: localise("credit", r, [1, 2], p, segments, None, credit_method="entropy_mask"))
    none = gathers(lambda p: localise("credit", r, [], p, segments, None, credit_method="entropy_mask"))
    assert some >= 1 and none == some
    assert gathers(lambda p: localise("random", r, [], p, segments, None)) == 0
    right = text_rollouts(TEXTS[:2], [1.0, 1.0], [0, 0])  # a shard whose traces are all right
    cut = Probe(PROPERTY_POLICY, PROPERTY_TASK, SamplingConfig(), torch.Generator()).segment(right, "lines")
    right = right.with_fields(correct=right.rewards > 0.5, segment_ids=cut)
    spec = credit.get("prefix_shaping")
    config = spec.make_config({"localiser": "credit", "credit_method": "entropy_mask"})
    assert gathers(lambda p: spec(right, p, config)) == some


def test_privileged_marks_follow_the_localiser_and_the_estimators_options():
    spec = credit.get("prefix_shaping")
    assert spec.reads_privileged(spec.make_config({"localiser": "oracle"}))
    assert spec.reads_privileged(spec.make_config({"localiser": "value"}))
    assert not spec.reads_privileged(spec.make_config({"localiser": "random"}))
    assert spec.reads_privileged(spec.make_config({"localiser": "credit"}))  # rredcot reads the reference
    assert not spec.reads_privileged(spec.make_config({"localiser": "credit", "credit_method": "tempo"}))
    assert not spec.reads_privileged(spec.make_config({"localiser": "credit",
                                                       "credit_method": "rredcot:include_reference=false"}))
    assert LOCALISERS.get("oracle").reads_privileged() and not LOCALISERS.get("random").reads_privileged()
    assert privileged("rredcot") and privileged("srpo") and not privileged("rrpo") and not privileged("tempo")
    assert not privileged("rredcot:include_reference=false")


def test_credo_methods_shows_the_privileged_column(capsys):
    assert main(["methods"]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines["name"][2] == "privileged"
    assert lines["oracle"][1:3] == ["localiser", "yes"] and lines["random"][1:3] == ["localiser", "no"]
    for name in ("tempo", "lambda_grpo", "entropy_mask", "gtpo", "otb"):
        assert lines[name][1:3] == ["estimator", "no"]
    assert lines["prefix_shaping"][1:3] == ["estimator", "yes"] and lines["credit"][1:3] == ["localiser", "yes"]


def test_weight_concentration_of_uniform_weights_and_of_a_mask():
    mask = torch.ones(2, 10, dtype=torch.bool)
    uniform = weight_concentration(torch.full((2, 10), 0.3), mask)
    assert abs(uniform["weight_gini"]) < 1e-9 and abs(uniform["effective_token_ratio"] - 1) < 1e-9
    keep = torch.zeros(2, 10)
    keep[:, :2] = 1  # a 0/1 mask keeping 4 of 20 tokens: Gini 1 - 4/20, effective ratio 4/20
    masked = weight_concentration(keep, mask)
    assert abs(masked["weight_gini"] - 0.8) < 1e-9 and abs(masked["effective_token_ratio"] - 0.2) < 1e-9
    assert math.isnan(weight_concentration(None, mask)["weight_gini"])


NEW = ["tempo", "tempo:at=segments", "lambda_grpo", "entropy_mask", "gtpo", "otb", "prefix_shaping:localiser=value",
       "prefix_shaping:localiser=oracle", "prefix_shaping:localiser=credit:credit_method=tempo"]


@pytest.mark.parametrize("method", NEW)
def test_each_new_estimator_trains_two_steps_deterministically(saved_policy, tmp_path, method):
    rows = []
    for name in ("a", "b"):
        t = Trainer(dapo_config(saved_policy, "steps=2", f"method={method}"), str(tmp_path / name), progress=False)
        t.train()
        rows.append(strip_time(t.log.rows()))
    assert rows[0] == rows[1]
    steps = [row for row in rows[0] if "advantage_abs_mean" in row]
    assert len(steps) == 2 and all(math.isfinite(row["advantage_abs_mean"]) for row in steps)


@pytest.mark.slow
def test_credo_compare_runs_the_new_estimators(saved_policy, tmp_path):
    from credo.lab.compare.run import compare
    results = compare("smoke", str(tmp_path / "cmp"), methods=("tempo", "entropy_mask:q=0.5"), start=saved_policy,
                      progress=False)
    assert results["failures"] == {}
    assert {"grpo", "tempo", "entropy_mask:q=0.5"} <= set(results["methods"])
    assert {"tempo", "entropy_mask:q=0.5"} <= set(results["audit"]["methods"])
