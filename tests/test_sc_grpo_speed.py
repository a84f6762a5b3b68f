"""SC-GRPO's teacher contexts read once per group (TinyPolicy.shared_prompt_logits, used by Probe.completion_logits):
the same logits and the same credit as reading every row in full, up to float rounding."""

import pytest
import torch

from credo import credit
from credo.core.probe import Probe
from credo.core.protocols import SamplingConfig, left_pad
from credo.policy.base import right_pad
from credo.policy.tiny import TinyPolicy
from credo.strategies.sampling import sample_scored
from credo.tasks.arith import PRESETS, ArithTask
from credo.train.sft import ensure_sft
from credo.train.sft_config import sft_config_for


@pytest.fixture(scope="module")
def start():
    policy = TinyPolicy.load(ensure_sft(sft_config_for("arith-long"), progress=False))
    policy.model.eval()
    return policy


def test_shared_prompts_give_the_full_forwards_logits(start):
    tok = start.tokenizer
    prompts = [tok.encode(t, bos=True) for t in ("12+3-4=?\n", "7*2+11-3+4=?\n")]
    rows = [0, 1, 0, 0, 1]  # two distinct prompts of different lengths (left padding), five rows
    p_ids, p_mask = left_pad([prompts[r] for r in rows], start.pad_id)
    completions = ["12+3=15\n", "7*2=14\n14+11=25\n", "1", "12+3=16\n16-4=12\n#### 12", "7*2=14\n"]
    c_ids, c_mask = right_pad([tok.encode(c, eos=True) for c in completions], start.pad_id)
    shared = start.shared_prompt_logits(p_ids, p_mask, c_ids, c_mask)
    with torch.no_grad():
        full = start.completion_logits(p_ids, p_mask, c_ids, c_mask)
    assert shared.shape == full.shape
    assert (shared - full)[c_mask].abs().max() < 1e-4  # float rounding only
    assert start.shared_prompt_logits(p_ids[:2], p_mask[:2], c_ids[:2], c_mask[:2]) is None  # nothing shared
    start.share_prompts = False
    try:
        assert start.shared_prompt_logits(p_ids, p_mask, c_ids, c_mask) is None  # the off switch
    finally:
        start.share_prompts = True


def test_sc_grpo_credit_is_the_same_with_teacher_contexts_read_once(start, monkeypatch):
    task = ArithTask(PRESETS["arith-long"], "arith-long")
    sampling = SamplingConfig(1.0, 1.0, 96)
    rollouts = sample_scored(start, task, task.heldout_problems(6), 8, sampling, torch.Generator().manual_seed(0))
    spec = credit.get("sc_grpo")
    config = spec.make_config({})

    def run() -> torch.Tensor:
        probe = Probe(start, task, sampling, torch.Generator().manual_seed(1))
        result = spec(rollouts, probe, config)
        return result.advantages * (1 if result.weights is None else result.weights)

    read_once = []
    original = TinyPolicy.shared_prompt_logits

    def spy(*args):
        out = original(*args)
        read_once.append(out is not None)
        return out

    monkeypatch.setattr(TinyPolicy, "shared_prompt_logits", spy)
    shared = run()
    assert read_once and all(read_once)  # the teacher's and the student's rows share their group's prompt
    monkeypatch.setattr(TinyPolicy, "shared_prompt_logits", lambda *args: None)
    full = run()
    assert bool(rollouts.correct.any()) and bool((~rollouts.correct).any())
    assert (shared - full).abs().max() < 1e-4 and shared.abs().sum() > 0
