import torch

from builders import probe_for, two_group_batch
from credo import credit
from credo.credit.attribution import AttributionConfig, oar_weights, players, score_contexts, shapley_values
from credo.core.groups import grpo_advantages
from credo.tasks.arith import ArithTask


def test_shapley_values_are_efficient(policy):
    task = ArithTask()
    r = two_group_batch(policy, task)
    pr = probe_for(policy, task, max_new_tokens=8)
    cfg = AttributionConfig(permutations=3)
    _, pl = players(r, pr, cfg)
    values, ends = shapley_values(r, pr, pl, cfg)
    for v, (empty, full), spans in zip(values, ends, pl.spans):
        if spans:
            assert torch.isclose(v.sum(), torch.tensor(full - empty), atol=1e-4)
    assert any(v.abs().sum() > 0 for v in values)


def test_answer_segment_is_not_a_player_and_padding_gets_nothing(policy):
    task = ArithTask()
    r = two_group_batch(policy, task)
    pr = probe_for(policy, task, max_new_tokens=8)
    _, pl = players(r, pr, AttributionConfig())
    assert [len(s) for s in pl.spans] == [1, 1, 0, 2, 2, 1]  # "#### x" lines are probed, not players
    for name in ("loo", "shapley", "counterfactual", "oar"):
        spec = credit.get(name)
        out = spec(r, probe_for(policy, task, max_new_tokens=8), spec.make_config({}))
        assert (out.advantages[~r.completion_mask] == 0).all(), name
        assert torch.isfinite(out.advantages).all(), name
        assert out.cost.tokens_scored > 0 and out.cost.tokens_generated == 0, name


def test_loo_matches_direct_removal_and_coarse_to_fine_costs_less(policy):
    task = ArithTask()
    r = two_group_batch(policy, task)
    spec = credit.get("loo")
    out = spec(r, probe_for(policy, task, max_new_tokens=8), spec.make_config({}))
    row = 3  # "12+13=25\n25+14=39\n#### 39": remove the second line and compare by hand
    pr = probe_for(policy, task, max_new_tokens=8)
    _, pl = players(r, pr, AttributionConfig())
    target = policy.encode_continuation("?39", eos=True)
    full, without = score_contexts(r, pr, [(row, pl.tokens[row], target),
                                          (row, pl.tokens[row][:9] + pl.tokens[row][18:], target)], 8)
    assert torch.isclose(out.segment_credit[row][1], full - without, atol=1e-5)
    coarse = spec(r, probe_for(policy, task, max_new_tokens=8),
                  spec.make_config({"coarse_to_fine": 2, "refine_top": 1}))
    assert coarse.cost.tokens_scored <= out.cost.tokens_scored + 1


def test_counterfactual_weights_in_range_and_oar_mass_preserved(policy):
    task = ArithTask()
    r = two_group_batch(policy, task)
    a = grpo_advantages(r.rewards, r.group)
    out = credit.get("counterfactual")(r, probe_for(policy, task, max_new_tokens=8))
    for i in range(r.batch_size):
        if a[i] != 0:
            w = out.advantages[i][r.completion_mask[i]] / a[i]
            assert (w >= 0.5 - 1e-6).all() and (w <= 2 + 1e-6).all()
    out = credit.get("oar")(r, probe_for(policy, task, max_new_tokens=8))
    for i in range(r.batch_size):
        if a[i] != 0:
            w = out.advantages[i][r.completion_mask[i]] / a[i]
            assert torch.isclose(w.mean(), torch.tensor(1.0), atol=1e-5)
    u = torch.tensor([0.0, 0.1, 0.25, 1.0])
    assert torch.allclose(oar_weights(u), torch.tensor([0.1, 0.4, 1.0, 2.0]))
