"""`dtype=bfloat16-mixed`: float32 weights, matrix products in bfloat16 under torch.autocast, on the CPU too."""

from __future__ import annotations

import json

import pytest
import torch

from builders import build_tokenizer, tiny_llama

from credo.cli.main import main
from credo.core.config import ConfigError
from credo.lab.audit.run import AuditConfig, reference_key
from credo.policy import load_policy
from credo.policy.base import SamplingConfig
from credo.policy.hf import HFPolicy
from credo.train.trainer import Trainer, load_train_config


def _pair() -> tuple[HFPolicy, HFPolicy]:
    """The same tiny Llama in float32 and in bfloat16-mixed (each its own copy of the same weights)."""
    tokenizer = build_tokenizer()
    return (HFPolicy(tiny_llama(tokenizer), tokenizer),
            HFPolicy(tiny_llama(tokenizer), tokenizer, autocast=torch.bfloat16))


def test_mixed_precision_scores_in_float32_close_to_but_not_bitwise_float32():
    full, mixed = _pair()
    ids, mask = full.encode_prompts(["State the final answer: 4 - 1 =", "Let me add 3"])
    out = full.sample(ids, mask, SamplingConfig(max_new_tokens=12), torch.Generator().manual_seed(0))
    reference, _ = full.score(ids, mask, out.completion_ids, out.completion_mask)
    logprobs, entropy = mixed.score(ids, mask, out.completion_ids, out.completion_mask, entropy=True)
    assert logprobs.dtype == torch.float32 and entropy.dtype == torch.float32
    gap = (logprobs - reference).abs()[out.completion_mask]
    assert gap.max() > 0  # the products did run in bfloat16
    assert gap.max() < 0.05  # ... and only rounding separates them (tiny Llama: logits of ~0.1)
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    assert mixed.copy().autocast == torch.bfloat16


def test_mixed_precision_sampling_repeats_from_a_seed():
    _, mixed = _pair()
    ids, mask = mixed.encode_prompts(["Let me add 3", "State the final answer: 2 + 2 ="])
    draws = [mixed.sample(ids, mask, SamplingConfig(max_new_tokens=10), torch.Generator().manual_seed(3))
             for _ in range(2)]
    assert torch.equal(draws[0].completion_ids, draws[1].completion_ids)
    assert torch.equal(draws[0].logprobs, draws[1].logprobs)


def _train(start: str, out: str, dtype: str) -> tuple[list[dict], Trainer]:
    config = load_train_config(None, [f"start={start}", "task=gym:chain_sum", "prompts_per_step=2", "group_size=2",
                                      "sampling.max_new_tokens=8", "steps=2", "eval_n=2", "final_eval_n=0",
                                      "lr=1e-3", f"dtype={dtype}", "device=cpu"])
    trainer = Trainer(config, out, progress=False)
    trainer.train()
    with open(f"{out}/metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows], trainer


def test_a_mixed_precision_run_repeats_from_its_seed_and_keeps_float32_weights(hf_dir, tmp_path):
    first, trainer = _train(hf_dir, str(tmp_path / "a"), "bfloat16-mixed")
    again, _ = _train(hf_dir, str(tmp_path / "b"), "bfloat16-mixed")
    assert first == again and len(first) == 3  # the evaluation before training and two steps
    assert trainer.policy.autocast == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in trainer.policy.model.parameters())
    assert "dtype: bfloat16-mixed" in (tmp_path / "a" / "config.yaml").read_text()


@pytest.mark.parametrize("command", ["train", "eval", "audit", "compare", "show"])
def test_bfloat16_mixed_is_a_cpu_setting_of_every_command(command, capsys):
    assert main([command, "--set", "device=cpu", "--set", "dtype=bfloat16-mixed", "--help-config"]) == 0
    assert 'dtype = "bfloat16-mixed"' in capsys.readouterr().out


def test_a_tiny_policy_refuses_bfloat16_mixed(saved_policy):
    with pytest.raises(ConfigError, match="dtype=bfloat16-mixed: .* tiny policy, which runs float32"):
        load_policy(saved_policy, autocast=torch.bfloat16)


def test_a_mixed_precision_audit_caches_its_reference_apart(saved_policy):
    keys = {dtype: reference_key(AuditConfig(checkpoint=saved_policy, n=4, group_size=2, dtype=dtype), saved_policy,
                                 torch.device("cpu"), torch.float32) for dtype in ("float32", "bfloat16-mixed")}
    assert keys["float32"] != keys["bfloat16-mixed"]
