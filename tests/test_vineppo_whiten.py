"""VinePPO's batch advantage whitening (its trainer's `whiten_advantages: true`)."""

import torch

from credo import credit
from credo.credit.mc import masked_whiten
from credo.core.segment import broadcast_segments
from credo.tasks.arith import ArithTask
from builders import probe_for, rollouts_of


def test_masked_whiten_is_unbiased_standardisation_over_the_mask():
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    out = masked_whiten(values, mask)
    active = torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected = (active - 2.5) / active.std(unbiased=True)
    assert torch.allclose(out[mask], expected, atol=1e-6) and (out[~mask] == 0).all()
    one = torch.tensor([[True, False, False], [False, False, False]])
    assert torch.equal(masked_whiten(values, one), values * one)


def test_vineppo_whitens_by_default_and_the_audit_switch_gives_the_raw_differences(policy):
    task = ArithTask()
    r = rollouts_of(policy, task, ["37+48=85\n#### 85", "37+48=86\n#### 86", "37+4\n#### 41", "3"])
    spec = credit.get("vineppo")
    white = spec(r, probe_for(policy, task), spec.make_config({"k": 3}))
    raw = spec(r, probe_for(policy, task), spec.make_config({"k": 3, "whiten": "false"}))
    mask = r.trainable_mask()
    seg = probe_for(policy, task).segment(r, "lines")
    assert torch.equal(raw.advantages, broadcast_segments(raw.segment_credit, seg) * mask)
    assert all(torch.equal(a, b) for a, b in zip(white.segment_credit, raw.segment_credit))  # same MC draws
    assert raw.advantages[mask].std() > 0
    assert torch.allclose(white.advantages, masked_whiten(raw.advantages, mask), atol=1e-6)
    assert abs(float(white.advantages[mask].mean())) < 1e-5
    assert abs(float(white.advantages[mask].std()) - 1) < 1e-4
    from credo.lab.audit.report import parse_method
    assert parse_method("vineppo")[2]["whiten"] is False
