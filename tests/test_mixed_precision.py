"""`dtype=bfloat16-mixed`: float32 weights, matrix products in bfloat16 under torch.autocast, on the CPU too."""

from __future__ import annotations

import json

import pytest
import torch

from builders import build_tokenizer, tiny_llama

from credo.cli.main import main
from credo.core.config import ConfigError
from credo.lab.audit.config import AuditConfig
from credo.lab.audit.reference import reference_key
from credo.policy import load_policy
from credo.core.protocols import SamplingConfig
from credo.policy.hf import HFPolicy
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer


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
    assert mixed.completion_logits(ids, mask, out.completion_ids, out.completion_mask).dtype == torch.float32
    gap = (logprobs - reference).abs()[out.completion_mask]
    assert gap.max() > 0  # the products did run in bfloat16
    assert gap.max() < 0.05  # ... and only rounding separates them (tiny Llama: logits of ~0.1)
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    assert mixed.copy().autocast == torch.bfloat16


def test_mixed_precision_sampling_repeats_from_a_seed_and_samples_in_bfloat16():
    full, mixed = _pair()
    ids, mask = mixed.encode_prompts(["Let me add 3", "State the final answer: 2 + 2 ="])
    draws = [p.sample(ids, mask, SamplingConfig(max_new_tokens=10), torch.Generator().manual_seed(3))
             for p in (mixed, mixed, full)]
    assert torch.equal(draws[0].completion_ids, draws[1].completion_ids)
    assert torch.equal(draws[0].logprobs, draws[1].logprobs)
    # the first token is drawn from the same prompt logits up to rounding: its log-prob differs, a little
    assert torch.equal(draws[0].completion_ids[:, 0], draws[2].completion_ids[:, 0])
    first = (draws[0].logprobs[:, 0] - draws[2].logprobs[:, 0]).abs()
    assert first.max() > 0 and first.max() < 0.05


def _train(start: str, out: str, dtype: str) -> tuple[list[dict], Trainer]:
    config = load_train_config(None, [f"start={start}", "task=gym:chain_sum", "prompts_per_step=2", "group_size=2",
                                      "sampling.max_new_tokens=8", "steps=2", "eval_n=2", "final_eval_n=0",
                                      "lr=1e-3", "loss.kl_coef=0.1", f"dtype={dtype}", "device=cpu"])
    trainer = Trainer(config, out, progress=False)
    trainer.train()
    with open(f"{out}/metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows], trainer


def test_a_mixed_precision_run_repeats_from_its_seed_and_keeps_float32_weights(hf_dir, tmp_path, monkeypatch):
    entered = []  # (policy, gradient on) of every autocast entry
    original = HFPolicy._autocast

    def spy(self):
        entered.append((id(self), torch.is_grad_enabled()))
        return original(self)

    monkeypatch.setattr(HFPolicy, "_autocast", spy)
    first, trainer = _train(hf_dir, str(tmp_path / "a"), "bfloat16-mixed")
    assert any(grad for _, grad in entered)  # the update's forward, not only sampling
    assert len({policy for policy, _ in entered}) == 2  # the policy and its KL reference (a copy)
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


class _Reached(Exception):
    """Raised by the load_policy spy: the command got as far as loading its model."""


@pytest.mark.parametrize("command,where", [("train", "credo.train.step.load_policy"),
                                           ("eval", "credo.policy.load_policy"),
                                           ("audit", "credo.lab.audit.reference.load_policy"),
                                           ("show", "credo.lab.show.view.load_policy"),
                                           ("sft", "credo.train.sft_hf.load_policy")])
def test_every_command_loads_its_model_for_mixed_precision(command, where, hf_dir, tmp_path, monkeypatch):
    asked = []

    def spy(path, device="cpu", *args, **kwargs):
        asked.append((kwargs.get("dtype", torch.float32), kwargs.get("autocast")))
        raise _Reached

    monkeypatch.setattr(where, spy)
    line = {"train": ["train", "--steps", "1", "--start", hf_dir, "--task", "gym:chain_sum"],
            "eval": ["eval", "--checkpoint", hf_dir, "--task", "gym:chain_sum", "--n", "2"],
            "audit": ["audit", "--checkpoint", hf_dir, "--task", "gym:chain_sum", "--n", "2", "--group-size", "2",
                      "--k-ref", "2"],
            "show": ["show", "--checkpoint", hf_dir, "--task", "gym:chain_sum", "--n", "1"],
            "sft": ["sft", "--start", hf_dir, "--task", "gym:chain_sum"]}[command]
    out = [] if command == "eval" else ["--out", str(tmp_path / "out")]
    with pytest.raises(_Reached):
        main(line + out + ["--set", "device=cpu", "--set", "dtype=bfloat16-mixed", "--quiet"])
    assert asked == [(torch.float32, torch.bfloat16)]


def test_a_mixed_precision_comparison_says_so_in_its_protocol_and_report():
    from dataclasses import replace
    from credo.lab.compare.presets import PRESETS, protocol
    from credo.lab.compare.report import protocol_lines
    smoke = PRESETS["smoke"]
    mixed = protocol(replace(smoke, train={**smoke.train, "dtype": "bfloat16-mixed"}), "", 1)
    full = protocol(replace(smoke, train={**smoke.train, "dtype": "float32"}), "", 1)
    assert mixed["dtype"] == "bfloat16-mixed" and "dtype" not in full  # float32 results keep their bytes
    assert "every run in dtype `bfloat16-mixed`" in protocol_lines({"protocol": mixed})[0]
    assert "dtype" not in protocol_lines({"protocol": full})[0]
