import json
import math
import os

import pytest
import torch

from builders import probe_for, rollouts_of, shipped_start
from credo import credit
from credo.lab.audit.config import AuditConfig
from credo.lab.audit.report import (METRICS, fidelity, first_error_top1, floor_credit, most_frequent_position,
                                    pairwise_rank)
from credo.lab.audit.run import run_audit, score_methods
from credo.lab.show.view import write_audit_page
from credo.core.config import ConfigError
from credo.credit.registry import register
from credo.core.rollouts import Credit
from credo.core.segment import segment_bounds
from credo.core.values import mc_values
from credo.tasks.arith import ArithTask


def test_mc_values_telescope_bound_and_terminal_prefix(policy):
    task = ArithTask()
    texts = ["37+48=85\n#### 85\n1+1=2", "37+48=85\n#### 85", "37+48=86\n#### 86"]
    r = rollouts_of(policy, task, texts)
    probe = probe_for(policy, task)
    seg = probe.segment(r, "lines")
    mc = mc_values(probe, r, seg, k=3)
    for v, reward in zip(mc.values, r.rewards):
        assert ((v >= 0) & (v <= 1)).all()
        assert v[-1] == reward
        diffs = v[1:] - v[:-1]
        assert torch.isclose(diffs.sum(), reward - v[0])
    # the prefix "37+48=85\n#### 85\n" already states the (correct) answer: terminal, value 1, unsampled
    assert mc.values[0].tolist()[2] == 1.0 and mc.values[0][-1] == 0.0
    assert torch.isnan(mc.samples[0][2]).all()


def test_mc_cost_counts_every_continuation(policy):
    task = ArithTask()
    texts = ["37+48=85\n#### 85", "37+48=86\n#### 86", "1"]
    r = rollouts_of(policy, task, texts)
    probe = probe_for(policy, task)
    seg = probe.segment(r, "lines")
    k = 4
    with probe.metered() as spent:
        mc_values(probe, r, seg, k=k)
    boundaries = 2 + 2 + 1  # s_0 and s_1 for two-line traces, s_0 for the one-segment trace
    prefix_tokens = sum(int(r.prompt_mask[i].sum()) + cut
                        for i, cuts in enumerate([[0, 9], [0, 9], [0]]) for cut in cuts)
    assert spent.tokens_scored == k * prefix_tokens
    assert 0 < spent.tokens_generated <= k * boundaries * 12


def test_vineppo_and_spo_chain_zero_on_padding_and_cost_reported(policy):
    task = ArithTask()
    r = rollouts_of(policy, task, ["37+48=85\n#### 85", "37+48=86\n#### 86", "3"])
    with torch.no_grad():
        old, _ = policy.score(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    r = r.with_fields(old_logprobs=old)
    assert [len(b) for b in segment_bounds(probe_for(policy, task).segment(r, "lines"))] == [2, 2, 1]
    segmenters = {"vineppo": "lines", "spo_chain": {"name": "cutpoints", "p": 0.9, "every": 1}}  # each one's own
    for name, segmenter in segmenters.items():
        spec = credit.get(name)
        result = spec(r, probe_for(policy, task), spec.make_config({"k": 2}))
        assert (result.advantages[~r.completion_mask] == 0).all()
        assert torch.isfinite(result.advantages).all()
        assert result.cost.tokens_generated > 0 and result.cost.tokens_scored > 0
        # segment credit is V(s_k) - V(s_{k-1}) of the MC values on the same seed (the same continuations):
        # one entry per segment, telescoping to r - V(s_0)
        segment_ids = probe_for(policy, task).segment(r, segmenter)
        mc = mc_values(probe_for(policy, task), r, segment_ids, k=2)
        assert [tuple(c.shape) for c in result.segment_credit] == [(len(b),) for b in segment_bounds(segment_ids)]
        for seg_credit, values, reward in zip(result.segment_credit, mc.values, r.rewards):
            assert torch.equal(seg_credit, values[1:] - values[:-1])
            assert torch.isclose(seg_credit.sum(), reward - values[0])


def test_fidelity_of_the_reference_itself_is_one_and_constant_credit_zero():
    ref = [torch.tensor([0.1, -0.5, 0.3]), torch.tensor([0.0, 0.2, -0.1, 0.4])]
    sp, pe, n = fidelity(ref, ref)
    assert abs(sp - 1) < 1e-9 and abs(pe - 1) < 1e-9 and n == 2
    sp, _, _ = fidelity([torch.zeros(3), torch.zeros(4)], ref)
    assert sp == 0.0


def test_first_error_top1_ties_are_shared():
    credit_ = [torch.tensor([0.0, -1.0, 0.5]), torch.zeros(4), torch.tensor([-1.0, -1.0])]
    assert first_error_top1(credit_, [1, 2, 0]) == (1.0 + 0.25 + 0.5) / 3
    assert math.isnan(first_error_top1(credit_, [None, None, 5]))  # no labelled trace in range: undefined


def test_audit_writes_schema(tmp_path):
    # the shipped SFT start writes arithmetic, so some wrong traces have a labelled first error to localise
    cfg = AuditConfig(checkpoint=shipped_start(), n=8, group_size=4, k_ref=2, methods=("vineppo:k=2", "rloo"),
                      max_new_tokens=16, localisers=("random", "oracle", "value"))
    report = run_audit(cfg, str(tmp_path / "audit"), progress=False).report
    on_disk = json.load(open(tmp_path / "audit" / "audit.json"))
    assert set(on_disk) == {"config", "methods", "localisers"}
    assert {"random", "grpo", "first_step", "vineppo:k=2", "rloo", "mc_reference"} <= set(on_disk["methods"])
    for row in on_disk["methods"].values():
        assert set(row) == set(METRICS)
    assert on_disk["methods"]["grpo"]["spearman"] == 0.0
    assert on_disk["methods"]["vineppo:k=2"]["tokens_generated_per_trace"] > 0
    assert os.path.getsize(tmp_path / "audit" / "audit.png") > 1000
    assert "| vineppo:k=2 |" in open(tmp_path / "audit" / "audit.md").read()
    loc = json.load(open(tmp_path / "audit" / "localisers.json"))
    assert loc == on_disk["localisers"]
    assert set(loc["localisers"]) == {"random", "oracle", "value"}
    assert loc["traces"] >= 1  # wrong traces whose first error is not their last step
    assert loc["localisers"]["oracle"]["localisation_top1"] == 1.0
    # second run reuses the cached reference: identical reference row
    again = run_audit(cfg, str(tmp_path / "audit2"), progress=False).report
    assert again["methods"]["mc_reference"]["first_error_top1"] == report["methods"]["mc_reference"]["first_error_top1"]


def test_pairwise_rank_counts_earlier_correct_steps_and_shares_ties():
    credit_ = [torch.tensor([0.5, -1.0, 0.2]), torch.tensor([0.0, 0.0, 0.0]), torch.tensor([-1.0, 0.3])]
    # trace 0: e=1 vs j=0 -> right; trace 1: e=2 vs j=0, 1 -> two ties; trace 2: e=0 has no earlier step
    assert pairwise_rank(credit_, [1, 2, 0]) == (1 + 0.5 + 0.5) / 3
    assert pairwise_rank([torch.tensor([-1.0, 0.0])], [1]) == 0.0


def test_position_prior_floor_blames_the_most_frequent_first_error():
    ref = [torch.zeros(3), torch.zeros(3), torch.zeros(2), torch.zeros(4)]
    assert most_frequent_position([1, 1, 0, None], ref) == 1
    credit_ = floor_credit("position_prior", ref, 0, prior=2)
    assert [int(torch.argmin(c)) for c in credit_] == [2, 2, 1, 2]  # clamped to the last segment


def test_unknown_method_or_option_fails_before_any_sampling(saved_policy, tmp_path, monkeypatch):
    import credo.lab.audit.run as audit
    monkeypatch.setattr(audit, "build_reference", lambda *a, **k: pytest.fail("sampled before checking methods"))
    for spec, field in (("nonexistent", "nonexistent"), ("rredcot:lamda=1", "lamda"), ("rredcot:lam=-1", "lam")):
        with pytest.raises(ConfigError, match=field):
            run_audit(AuditConfig(checkpoint=saved_policy, n=8, group_size=4, k_ref=2, methods=(spec,)),
                      str(tmp_path / "a"), progress=False)


if "weights_only_for_test" not in credit.names():
    @register("weights_only_for_test", "test estimator: GRPO advantages, credit carried by token weights")
    def _weights_only(rollouts, probe, config):
        from credo.core.groups import broadcast, grpo_advantages
        advantages = broadcast(grpo_advantages(rollouts.rewards, rollouts.group), rollouts)
        positions = torch.arange(rollouts.completion_ids.shape[1], dtype=torch.float32)[None]
        return Credit(advantages=advantages, weights=(1 + positions / 10) * rollouts.completion_mask)


def test_audit_scores_a_weight_only_method_differently_from_grpo(policy):
    task = ArithTask()
    texts = ["37+48=85\n#### 85", "37+48=86\n#### 86", "37+48=85\n#### 86", "37+48=84\n#### 85"]
    r = rollouts_of(policy, task, texts)
    seg = probe_for(policy, task).segment(r, "lines")
    from credo.lab.audit.report import checked_methods
    rows = {}
    failures = score_methods(AuditConfig(),
                             checked_methods(["grpo:std=sample", "weights_only_for_test"]), r, seg, policy, task,
                             False, lambda label, credit_, cost: rows.__setitem__(label, credit_))
    assert not failures
    for grpo_credit, weighted in zip(rows["grpo:std=sample"], rows["weights_only_for_test"]):
        assert torch.allclose(grpo_credit, grpo_credit[0].expand_as(grpo_credit))  # uniform over segments
        assert float(grpo_credit[0]) != 0  # every row is in the mixed group
        assert not torch.allclose(weighted, weighted[0].expand_as(weighted))  # the weights are seen


def test_split_half_differences_use_each_half_of_the_samples():
    import torch
    from credo.lab.audit.report import split_half_differences, split_half_spearman
    from credo.core.values import MCValues
    # one row, 3 sampled prefixes (4 samples each) and its reward; halves disagree only on the middle prefix
    samples = torch.tensor([[1., 1., 1., 1.], [1., 1., 0., 0.], [0., 0., 0., 0.]])
    values = torch.tensor([1.0, 0.5, 0.0, 0.0])
    ((a, b),) = split_half_differences(MCValues([values], [samples]))
    assert torch.equal(a, torch.tensor([0.0, -1.0, 0.0])) and torch.equal(b, torch.tensor([-1.0, 0.0, 0.0]))
    # identical halves agree perfectly
    same = torch.tensor([[1., 1.], [1., 0.], [0., 0.]])
    assert split_half_spearman(MCValues([torch.tensor([1.0, 0.5, 0.0, 0.0])], [torch.cat([same, same], 1)])) == 1.0


def test_audit_on_a_jsonl_task_writes_its_plot_and_page(saved_policy, tmp_path):
    """A task without step labels (jsonl): first_error_top1 is NaN for every row, which crashed the log-scaled
    plot after audit.json and audit.md were written."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(30)))
    out = tmp_path / "audit"
    cfg = AuditConfig(checkpoint=saved_policy, task=f"jsonl:{data}", n=4, group_size=2, k_ref=2, methods=("rloo",),
                      max_new_tokens=8)
    audit = run_audit(cfg, str(out), progress=False)
    write_audit_page(str(out), audit)  # the page of a task without step labels too
    report = audit.report
    assert all(math.isnan(row["first_error_top1"]) for row in report["methods"].values())
    assert os.path.getsize(out / "audit.png") > 1000
    assert "<html" in open(out / "audit.html").read()


def test_audit_plot_with_an_undefined_metric_and_cost(tmp_path):
    from credo.lab.audit.report import plot_audit
    nan = float("nan")
    rows = {"grpo": {"spearman": 0.0, "first_error_top1": nan, "cost_vs_grpo_step": 0.0},
            "broken": {"spearman": 0.5, "first_error_top1": nan, "cost_vs_grpo_step": nan}}
    plot_audit({"methods": rows}, str(tmp_path / "audit.png"))
    assert os.path.getsize(tmp_path / "audit.png") > 1000


def test_audit_plot_marks_privileged_methods(tmp_path, monkeypatch):
    from matplotlib.axes import Axes
    from credo.lab.audit.report import plot_audit
    labels = []
    real = Axes.annotate
    monkeypatch.setattr(Axes, "annotate", lambda self, text, *a, **k: labels.append(text) or real(self, text, *a, **k))
    rows = {name: {"spearman": 0.1, "first_error_top1": 0.2, "cost_vs_grpo_step": 1.0} for name in ("grpo", "rredcot")}
    plot_audit({"methods": rows, "config": {"privileged_methods": ["rredcot"]}}, str(tmp_path / "audit.png"))
    assert sorted(set(labels)) == ["grpo", "rredcot †"]


def test_sc_grpo_is_also_scored_on_the_rows_it_weights_with_their_share():
    """Rows of groups SC-GRPO does not weight (here n_c = 1: plain GRPO) carry row-constant credit, which
    locates nothing by design; the routed row scores SC-GRPO's weights on the 2 <= n_c < G groups alone."""
    from types import SimpleNamespace

    from credo import credit
    from credo.lab.audit.report import Labels, routed_rows, score_row
    correct = torch.tensor([1, 1, 0, 0, 1, 0, 0, 0], dtype=torch.bool)
    rollouts = SimpleNamespace(group=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), correct=correct)
    first = [None, None, 1, 2, None, 0, 1, 2]
    seg = [torch.zeros(3) for _ in range(8)]
    for i in (2, 3):  # the weighted wrong rows: most negative at the first error
        seg[i][first[i]] = -1.0
    reference = [torch.tensor([0.0, -0.5, -0.5]) for _ in range(8)]
    labels = Labels(first, [None] * 8, [None if f is None else "result" for f in first])
    cost = {"tokens_scored_per_trace": 1.0, "tokens_generated_per_trace": 0.0, "seconds_per_trace": 0.0}
    blended = score_row(seg, reference, labels, cost, 10.0)
    methods = [("sc_grpo", "sc_grpo", credit.get("sc_grpo").make_config({}))]
    out = routed_rows(methods, {"sc_grpo": seg}, {"sc_grpo": blended}, rollouts, reference, labels, 10.0)
    row = out["sc_grpo · routed rows"]
    assert row["first_error_top1"] == 1.0 and blended["first_error_top1"] < 1.0
    assert row["routed_share"] == 0.5 and abs(row["routed_share_labelled"] - 2 / 5) < 1e-12


def test_a_localisers_resets_are_counted_at_each_step_and_its_hits_by_where_the_error_lies():
    from credo.lab.audit.localisation import localiser_table, pick_figures
    first = [0, 1, 2, 3, 4]
    picks = [0, 0, 2, 0, 4]  # right on the errors at steps 1, 3 and 5; step 1 for the others
    figures = pick_figures(picks, first)
    assert figures["share_by_step"] == {"1": 0.6, "3": 0.2, "5": 0.2}
    assert figures["top1_by_position"] == {"step 1": 1.0, "steps 2-3": 0.5, "steps 4+": 0.5}
    loc = {"traces": 5, "oracle_step1_share": 0.2, "random_top1_expectation": 0.2, "failures": {},
           "oracle_share_by_step": pick_figures(first, first)["share_by_step"],
           "localisers": {"prompt": {"localisation_top1": 0.6, "localisation_top1_localisable": 0.6,
                                     "step1_share": 0.6, "reset_success": 0.0, "after_error_success": 0.0,
                                     "clean_prefix_gain": 0.0, "tokens_scored_per_trace": 0.0, **figures}}}
    table = localiser_table(loc)
    assert "| oracle (first errors) | 0.20 | 0.20 | 0.20 | 0.20 | 0.20 | — |" in table
    assert "| prompt | 0.60 | 0.00 | 0.20 | 0.00 | 0.20 | step 1 1.00, steps 2-3 0.50, steps 4+ 0.50 |" in table
    assert "Top-1 by the kind" not in table  # the kinds were not given


def test_a_localisers_top1_is_split_by_the_kind_of_the_first_error():
    from credo.lab.audit.localisation import pick_figures, slip_table
    first, picks = [0, 1, 2, 3, 4], [0, 0, 2, 0, 4]
    slips = ["operand", "result", "result", "carry", None]  # the last trace's kind is not known
    figures = pick_figures(picks, first, slips)
    assert list(figures["top1_by_slip"].items()) == [("result", 0.5), ("operand", 1.0), ("carry", 0.0)]
    assert list(figures["slip_counts"].items()) == [("result", 2), ("operand", 1), ("carry", 1)]
    lines = slip_table({"prompt": figures, "random": {"top1_by_slip": {"result": 0.25}}})
    assert lines[3] == "| localiser | result (2) | operand (1) | carry (1) |"
    assert lines[5:] == ["| prompt | 0.50 | 1.00 | 0.00 |", "| random | 0.25 | nan | nan |"]
