"""Value probes (credo.core.values) and the SRPO value localiser built on them."""

import math

import pytest
import torch

from builders import THREE_TERMS, probe_for, rollouts_of, shipped_start
from credo.core.values import answer_values, reference_tails, suffix_values
from credo.policy import load_policy
from credo.core.protocols import Problem, SamplingConfig
from credo.core.probe import Probe
from credo.strategies.localisers import first_value_drop, localise, localise_by_value
from credo.core.segment import segment_bounds
from credo.tasks.arith import ArithTask

P2 = THREE_TERMS
P4 = Problem("37+48-12+55", "37+48-12+55\n", "128", {"terms": [37, 48, 12, 55], "ops": ["+", "-", "+"]})
GROUP = ["12+13=25\n25+14=39\n#### 39", "12+13=25\n25+14=38\n#### 38", "12+13=26\n26+14=40\n#### 40",
         "12+13=26\n#### 26"]


def brute_force(policy, task, r, seg, mode, include_reference):
    """Every prefix re-scored from scratch with policy.score (no branches, no KV reuse)."""
    bounds = segment_bounds(seg)
    out = []
    for i, segs in enumerate(bounds):
        text = r.completions[i]
        v = []
        for j in range(len(segs)):
            cut = 0 if j == 0 else segs[j - 1][1]
            prefix = policy.decode(r.completion_ids[i, :cut])
            tails = {policy.decode(r.completion_ids[m, b[j][0]:int(r.lengths[m])]): float(r.rewards[m])
                     for m, b in enumerate(bounds) if len(b) > j}
            if include_reference:
                tails["".join(task.reference_solution(r.problems[i])[j:])] = 1.0
            num = den = 0.0
            for tail, u in tails.items():
                p_ids, p_mask = policy.encode_prompts([r.problems[i].prompt + prefix])
                t_ids, t_mask = policy.encode_completions([tail])
                with torch.no_grad():
                    logp, _ = policy.score(p_ids, p_mask, t_ids, t_mask)
                prob = math.exp(float(logp.sum()))
                assert u == task.reward(r.problems[i], prefix + tail)  # the member's reward is the tail's utility
                num += u * prob
                den += prob
            v.append(num if mode == "absolute" else (num / den if num else 0.0))
        out.append(v + [float(r.rewards[i])])
        assert text  # every row has a completion
    return out


@pytest.mark.parametrize("mode", ["normalized", "absolute"])
@pytest.mark.parametrize("include_reference", [True, False])
@pytest.mark.parametrize("reuse_prefix", [True, False])
def test_suffix_value_equals_brute_force_rescoring_of_every_prefix(policy, mode, include_reference, reuse_prefix):
    task = ArithTask()
    r = rollouts_of(policy, task, GROUP, P2)
    probe = probe_for(policy, task, max_new_tokens=8)
    seg = probe.segment(r, "lines")
    got = suffix_values(r, probe, seg, mode, include_reference, reuse_prefix)
    want = brute_force(policy, task, r, seg, mode, include_reference)
    for g, w in zip(got, want):
        assert torch.allclose(g, torch.tensor(w), rtol=1e-4, atol=1e-9), (g, w)


def test_suffix_value_of_a_prefix_shared_with_a_correct_member_is_positive(policy):
    task = ArithTask()
    r = rollouts_of(policy, task, GROUP, P2)
    probe = probe_for(policy, task, max_new_tokens=8)
    for mode in ("normalized", "absolute"):
        values = suffix_values(r, probe, probe.segment(r, "lines"), mode, include_reference=False)
        assert values[1][1] > 0  # row 1 is wrong, but "12+13=25\n" is also the correct row 0's prefix
        assert values[1][-1] == 0 and values[0][-1] == 1


def test_a_row_without_segments_has_only_its_outcome(policy):
    task = ArithTask()
    r = rollouts_of(policy, task, GROUP[:3], P2)
    mask = r.completion_mask.clone()
    mask[2] = False  # nothing generated (a zero-length completion)
    r = r.with_fields(completion_mask=mask, rewards=torch.tensor([1.0, 0.0, 0.0]))
    probe = probe_for(policy, task, max_new_tokens=8)
    seg = probe.segment(r, "lines")
    assert segment_bounds(seg)[2] == []
    for values in (suffix_values(r, probe, seg), answer_values(r, probe, seg)):
        assert values[2].tolist() == [0.0] and len(values[0]) == 4


def test_groups_do_not_leak_and_absolute_scores_only_useful_tails(policy):
    task = ArithTask()
    r = rollouts_of(policy, task, GROUP[1:3] + GROUP[:1], P2, groups=[0, 0, 1])
    probe = probe_for(policy, task, max_new_tokens=8)
    seg = probe.segment(r, "lines")
    values = suffix_values(r, probe, seg, "normalized", include_reference=False)
    assert values[0][1] == 0  # the correct row is in another group: its tail is not a candidate
    with probe.metered() as spent:
        suffix_values(r, probe, seg, "absolute", include_reference=False)
    # absolute: only the correct row's own tails (s_0, s_1, s_2 of row 2) are scored after its trace
    tails = sum(len(policy.encode_completions([GROUP[0][len(p):]])[0][0])
                for p in ("", "12+13=25\n", "12+13=25\n25+14=39\n"))
    assert spent.tokens_scored == int(r.prompt_mask[2].sum() + r.completion_mask[2].sum()) + tails


def test_answer_absolute_conditions_on_the_never_sampled_marker(policy):
    task = ArithTask()
    r = rollouts_of(policy, task, GROUP[:2], P2)
    probe = probe_for(policy, task, max_new_tokens=8)
    seg = probe.segment(r, "lines")
    values = answer_values(r, probe, seg, "absolute", include_gold=True)
    p_ids, p_mask = policy.encode_prompts([P2.prompt + "?"])  # s_0 + T
    a_ids, a_mask = policy.encode_completions(["39"])
    with torch.no_grad():
        logp, _ = policy.score(p_ids, p_mask, a_ids, a_mask)
    assert math.isclose(float(values[0][0]), math.exp(float(logp.sum())), rel_tol=1e-4)


def test_reference_tails_follow_the_solution_steps(policy):
    task = ArithTask()
    steps = task.reference_solution(P4)
    assert "".join(steps) == task.solution(P4) and len(steps) == 4
    tails, reward = reference_tails(probe_for(policy, task, max_new_tokens=8), P4, 5)
    assert reward == 1.0
    assert policy.decode(torch.tensor(tails[2])) == "73+55=128\n#### 128"
    assert tails[4] is None


def test_first_value_drop_rule():
    assert first_value_drop(torch.tensor([0.5, 0.49, 0.1, 0.3, 0.0]), 0.05) == 1  # the first, not the largest
    assert first_value_drop(torch.tensor([0.5, 0.2, 0.1, 0.9, 0.0]), 0.05) == 0
    assert first_value_drop(torch.tensor([0.5, 0.5, 0.5, 0.0]), 0.05) == 0  # the final transition is excluded
    assert first_value_drop(torch.tensor([0.3, 0.4, 0.45, 0.0]), 0.05) == 0  # no drop qualifies: step 1
    assert first_value_drop(torch.tensor([0.3, 0.4, 0.2, 0.0]), 0.05) == 1


def test_value_localiser_values_each_parent_alone_and_needs_an_answer(policy):
    task = ArithTask()
    texts = ["12+13=25\n25+14=38\n#### 38", "12+13=25\n25+14=39\n#### 39", "12+13=26\n26+14=40\n", "12+13=26\n"]
    r = rollouts_of(policy, task, texts, P2)
    probe = probe_for(policy, task, max_new_tokens=8)
    seg = probe.segment(r, "lines")
    together = localise_by_value(r, [0, 2, 3], probe, seg, 0.05)
    alone = [localise_by_value(r, [row], probe, seg, 0.05)[0] for row in (0, 2, 3)]
    assert together == alone  # the correct row 1 of the same group is never a candidate
    assert together[1:] == [0, 0]  # no final answer: step 1


def test_value_localiser_finds_the_first_error_on_the_shipped_start():
    policy = load_policy(shipped_start())
    task = ArithTask()
    texts = ["37+48=85\n85-12=74\n74+55=129\n#### 129",   # first error at step 2 (index 1)
             "37+48=86\n86-12=74\n74+55=129\n#### 129",   # at step 1, later lines carry it forward
             "37+48=85\n85-12=73\n73+55=127\n#### 127"]   # at step 3
    r = rollouts_of(policy, task, texts, problem=P4)
    probe = Probe(policy, task, SamplingConfig(max_new_tokens=8), torch.Generator().manual_seed(0))
    seg = probe.segment(r, "lines")
    assert localise("value", r, [0, 1, 2], probe, seg, None) == [1, 0, 2]
