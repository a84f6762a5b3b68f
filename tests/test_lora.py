"""LoRA on the tiny random Llama: the settings, adapter-only checkpoints with their base checked, a bit-identical
resume, the KL reference as the base with the adapter off, estimators scoring through the adapter, merge."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from builders import CHAIN_SUM_OPTIONS

from credo import credit
from credo.cli.main import main
from credo.core.config import ConfigError, UserError, load_config, to_dict
from credo.core.probe import Probe
from credo.policy import load_policy
from credo.policy.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterDisabled, LoraSettings, weights_digest
from credo.core.protocols import SamplingConfig
from credo.policy.hf import HFPolicy
from credo.tasks import make_task
from credo.train.config import nest_lora
from credo.train.sft_hf import HFSFTConfig
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer

ADAPTER_FILES = sorted([ADAPTER_WEIGHTS, ADAPTER_CONFIG, "policy.json"])
FAST = ["task=gym:chain_sum", "prompts_per_step=2", "group_size=2", "sampling.max_new_tokens=6", "eval_n=2",
        "final_eval_n=2", "eval_every=1", "checkpoint_every=1", "minibatches=2", "lr=5e-2", "loss.kl_coef=0.1",
        "device=cpu", "lora.r=4", "lora.dropout=0.2"]


def lora_config(start: str, steps: int = 2, *extra: str):
    return load_train_config(None, [f"start={start}", f"steps={steps}", *FAST, *extra])


def rows_of(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in f]


def adapter_tensors(directory: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(os.path.join(directory, ADAPTER_WEIGHTS))


@pytest.fixture(scope="module")
def lora_run(hf_dir, tmp_path_factory) -> str:
    """A finished 2-step LoRA GRPO run of the tiny Llama (rank 4, dropout 0.2, KL 0.1)."""
    run = str(tmp_path_factory.mktemp("lora") / "run")
    Trainer(lora_config(hf_dir), run, progress=False).train()
    return run


def test_lora_is_off_by_default_and_its_fields_are_checked_by_their_paths():
    config = load_train_config()
    assert config.lora == LoraSettings() and config.lora.r == 0 and "lora" not in to_dict(config)
    assert LoraSettings().target_modules == ("all-linear",)
    for setting, message in (("lora.r=-1", "train.lora.r must be in 0..4,096"),
                             ("lora.dropout=1", r"train.lora.dropout must be in \[0, 1\)"),
                             ("lora.alpha=0", "train.lora.alpha must be > 0"),
                             ("lora.target_modules=all-linear,q_proj", "train.lora.target_modules")):
        with pytest.raises(ConfigError, match=message):
            load_train_config(overrides=[setting])
    with pytest.raises(ConfigError, match="sft.lora.r must be in"):
        load_config(HFSFTConfig, None, ["lora.r=5000"], prefix="sft.")
    assert load_train_config(overrides=["lora.r=8", "lora.target_modules=q_proj,v_proj"]).lora == \
        LoraSettings(r=8, target_modules=("q_proj", "v_proj"))


@pytest.mark.parametrize("command", [["train"], ["sft", "--start", "smollm2-135m"]])
def test_help_config_lists_the_lora_fields_with_their_docs(command, capsys):
    assert main(command + ["--help-config"]) == 0
    listing = " ".join(capsys.readouterr().out.split())  # docs wrapped at 100 columns, read as one text
    for line in ("lora.r = 0", "lora.alpha = 16", "lora.dropout = 0.0", 'lora.target_modules = ["all-linear"]',
                 "every linear layer of the attention and the MLP"):
        assert line in listing


def test_a_recorded_run_with_the_old_flat_lora_keys_loads():
    assert nest_lora({"method": "grpo", "lora_r": 0, "lora_alpha": 16, "lora_targets": ["q_proj"]}) == \
        {"method": "grpo"}
    assert nest_lora({"lora_r": 4, "lora_alpha": 8, "lora_targets": ["q_proj"]}) == \
        {"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj"]}}


def test_a_tiny_policy_or_a_module_the_model_lacks_is_one_line(saved_policy, hf_dir):
    with pytest.raises(ConfigError, match="lora.r=4: LoRA needs a Hugging Face model"):
        load_policy(saved_policy, lora=LoraSettings(r=4))
    with pytest.raises(UserError, match=r"lora.target_modules=\['c_attn'\]: peft cannot place adapters"):
        load_policy(hf_dir, lora=LoraSettings(r=4, target_modules=("c_attn",)))


def test_a_lora_run_saves_the_adapter_alone_with_its_base_named_and_digested(lora_run, hf_dir):
    final = os.path.join(lora_run, "final")
    assert sorted(os.listdir(final)) == ADAPTER_FILES
    checkpoints = os.path.join(lora_run, "checkpoints")
    for step in os.listdir(checkpoints):  # the adapter and the trainer's state: no base weights
        assert {ADAPTER_WEIGHTS, ADAPTER_CONFIG, "policy.json"} <= set(os.listdir(os.path.join(checkpoints, step)))
        assert not any(n.startswith("model") for n in os.listdir(os.path.join(checkpoints, step)))
    meta = json.load(open(os.path.join(final, "policy.json")))["adapter"]
    assert meta == {"base": os.path.abspath(hf_dir), "base_digest": weights_digest(hf_dir)}
    tensors = adapter_tensors(final)
    assert tensors and all("lora_" in k for k in tensors)
    assert any("mlp" in k for k in tensors) and any("self_attn" in k for k in tensors)  # all-linear by default
    assert any(float(v.abs().max()) > 0 for k, v in tensors.items() if "lora_B" in k)  # trained (B starts at 0)
    assert "lora:" in open(os.path.join(lora_run, "config.yaml")).read()


def test_a_lora_run_stopped_and_resumed_is_bit_identical(lora_run, hf_dir, tmp_path):
    stopped = str(tmp_path / "stopped")
    Trainer(lora_config(hf_dir), stopped, progress=False).train(stop_after=1)  # as if killed after step 1
    torch.manual_seed(12345)  # a new process's global RNG is not where the stopped one left it
    Trainer(lora_config(hf_dir), stopped, progress=False).train()  # a new trainer: everything from disk
    assert rows_of(stopped) == rows_of(lora_run) and len(rows_of(stopped)) == 3
    a, b = adapter_tensors(os.path.join(lora_run, "final")), adapter_tensors(os.path.join(stopped, "final"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # step 1 scores the base against itself (the adapter's B starts at 0); whether a later step's KL is above 0
    # depends on a random tiny model earning some reward, so the reference is checked on set weights below
    assert rows_of(lora_run)[1]["kl"] == 0.0


def test_a_checkpoint_of_another_base_is_refused_on_resume(lora_run, hf_dir, tmp_path):
    from credo.core.state_io import CorruptStateError, write_manifest
    run = str(tmp_path / "run")
    shutil.copytree(lora_run, run)
    shutil.rmtree(os.path.join(run, "final"))
    os.remove(os.path.join(run, "summary.json"))
    for step in os.listdir(os.path.join(run, "checkpoints")):
        path = os.path.join(run, "checkpoints", step, "policy.json")
        meta = json.load(open(path))
        meta["adapter"]["base_digest"] = "sha256:" + "0" * 64
        json.dump(meta, open(path, "w"))
        write_manifest(os.path.join(run, "checkpoints", step))  # a checkpoint that verifies: the digest check speaks
    trainer = Trainer(lora_config(hf_dir), run, progress=False)
    with pytest.raises(CorruptStateError, match="the checkpoint's adapter was trained on base .* but this run's start"):
        trainer.train()


def test_the_kl_reference_is_the_base_with_the_adapter_off_and_no_second_model(hf_dir, tmp_path, monkeypatch):
    import transformers
    built = []
    original = transformers.LlamaForCausalLM.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(transformers.LlamaForCausalLM, "__init__", counting)
    monkeypatch.setattr(HFPolicy, "copy", lambda self: pytest.fail("the reference copied the policy"))
    trainer = Trainer(lora_config(hf_dir), str(tmp_path / "run"), progress=False)
    assert len(built) == 1  # the start, once
    assert isinstance(trainer.reference, AdapterDisabled) and trainer.reference.policy is trainer.policy
    with torch.no_grad():
        for name, p in trainer.policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5 * torch.randn_like(p))
    monkeypatch.setattr(transformers.LlamaForCausalLM, "__init__", original)
    base = load_policy(hf_dir)
    ids, mask = base.encode_prompts(["2 + 3 =", "State the final answer: 4 - 1 ="])
    done, done_mask = base.encode_completions(["<answer>5</answer>", "So 3"])
    with torch.no_grad():
        reference, _ = trainer.reference.score(ids, mask, done, done_mask)
        want, _ = base.score(ids, mask, done, done_mask)
        policy, _ = trainer.policy.score(ids, mask, done, done_mask)
    assert torch.equal(reference, want)
    assert (policy - want).abs().max() > 1e-3  # ... and the policy itself scores with its adapter


def adapter_calls(policy) -> list[bool]:
    """A list that gets (adapters on?) for every forward of `policy`'s adapted layers from now on."""
    from peft.tuners.lora import Linear as LoraLinear
    calls: list[bool] = []
    for module in policy.model.modules():
        if isinstance(module, LoraLinear):
            module.register_forward_hook(lambda m, args, out: calls.append(not m.disable_adapters))
    return calls


def test_the_prompt_localiser_asks_the_policy_with_its_adapter_applied(hf_dir):
    import random
    from credo.strategies.localisers import localise
    from test_hf import gym_rollouts
    task = make_task("gym:chain_sum", CHAIN_SUM_OPTIONS)
    policy = load_policy(hf_dir, lora=LoraSettings(r=4))
    rollouts = gym_rollouts(policy, task)
    probe = Probe(policy, task, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(0))
    segments = probe.segment(rollouts, "keyword_entropy")
    calls = adapter_calls(policy)
    wrong = [i for i in range(rollouts.batch_size) if not bool(rollouts.correct[i])]
    # what is asserted is the forwards going through the adapters, not the reply: a few tokens of it do
    localise("prompt", rollouts, wrong, probe, segments, random.Random(0), prompt_max_new_tokens=8)
    assert calls and all(calls)


@pytest.mark.parametrize("name", ["rredcot", "sc_grpo"])
def test_estimators_probe_the_policy_with_its_adapter_applied(hf_dir, name):
    from test_hf import gym_rollouts
    task = make_task("gym:chain_sum", CHAIN_SUM_OPTIONS)
    adapted = load_policy(hf_dir, lora=LoraSettings(r=4))
    with torch.no_grad():  # an adapter far from zero (a fresh one is: B starts at 0)
        for n, p in adapted.model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    calls = adapter_calls(adapted)  # (adapters on?) of every adapted layer's forward while the estimator runs
    out = {}
    for label, policy in (("adapted", adapted), ("base", load_policy(hf_dir))):
        rollouts = gym_rollouts(policy, task)
        probe = Probe(policy, task, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(0))
        spec = credit.get(name)
        calls.clear()
        given = spec(rollouts, probe, spec.make_config({}))
        out[label] = given.advantages if given.weights is None else given.advantages * given.weights  # SC-GRPO's
        if label == "adapted":
            assert calls and all(calls)  # the probe's forwards went through the adapters, switched on
    assert not torch.allclose(out["adapted"], out["base"], atol=1e-2)


def test_eval_and_merge_take_the_adapter_and_merge_writes_its_full_weights(lora_run, tmp_path, capsys):
    final = os.path.join(lora_run, "final")
    assert main(["eval", "--checkpoint", lora_run, "--task", "gym:chain_sum", "--n", "2", "--max-new-tokens", "4",
                 "--quiet"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("accuracy=")
    merged = str(tmp_path / "merged")
    assert main(["merge", final, "--out", merged]) == 0
    assert os.path.isfile(os.path.join(merged, "config.json")) and not os.path.exists(os.path.join(merged,
                                                                                                  ADAPTER_WEIGHTS))
    full, adapted = load_policy(merged), load_policy(final)
    assert not hasattr(full.model, "disable_adapter")
    ids, mask = full.encode_prompts(["2 + 3 ="])
    done, done_mask = full.encode_completions(["<answer>5</answer>"])
    with torch.no_grad():
        assert torch.allclose(full.score(ids, mask, done, done_mask)[0], adapted.score(ids, mask, done, done_mask)[0],
                              atol=1e-5)
    assert main(["merge", merged, "--out", str(tmp_path / "again")]) == 2
    assert "is not a LoRA adapter" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["show", "audit"])
def test_show_and_audit_take_an_adapter_checkpoint(lora_run, tmp_path, command):
    line = {"show": ["show", "--n", "1"], "audit": ["audit", "--n", "4", "--group-size", "2", "--k-ref", "2"]}[command]
    assert main(line + ["--checkpoint", os.path.join(lora_run, "final"), "--task", "gym:chain_sum", "--out",
                        str(tmp_path / "out"), "--set", "max_new_tokens=4", "--quiet"]) in (0, 1)
    assert os.listdir(tmp_path / "out")


def test_an_adapter_on_changed_base_weights_is_one_line_naming_its_policy_json(lora_run, hf_dir, tmp_path, capsys):
    base, adapter = str(tmp_path / "base"), str(tmp_path / "adapter")
    shutil.copytree(hf_dir, base)
    shutil.copytree(os.path.join(lora_run, "final"), adapter)
    meta = json.load(open(os.path.join(adapter, "policy.json")))
    meta["adapter"]["base"] = base
    json.dump(meta, open(os.path.join(adapter, "policy.json"), "w"))
    assert load_policy(adapter).adapter_base == (base, weights_digest(hf_dir))  # the same weights elsewhere: fine
    from safetensors.torch import load_file, save_file
    weights = load_file(os.path.join(base, "model.safetensors"))
    weights = {k: v + 1e-3 if k.endswith("norm.weight") else v for k, v in weights.items()}
    save_file(weights, os.path.join(base, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=f"{os.path.join(adapter, 'policy.json')}: the adapter was trained on base"):
        load_policy(adapter)
    assert main(["eval", "--checkpoint", adapter, "--task", "gym:chain_sum", "--n", "2", "--quiet"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_lora_from_an_adapter_start_trains_on_that_start(lora_run, tmp_path):
    start = os.path.join(lora_run, "final")
    run = str(tmp_path / "second")
    trainer = Trainer(lora_config(start, 1, "lora.r=2", "lora.dropout=0"), run, progress=False)
    first = load_policy(start)
    ids, mask = first.encode_prompts(["2 + 3 ="])
    done, done_mask = first.encode_completions(["<answer>5</answer>"])
    with torch.no_grad():  # the reference (adapter off) is the start, its own adapter merged in
        assert torch.allclose(trainer.reference.score(ids, mask, done, done_mask)[0],
                              first.score(ids, mask, done, done_mask)[0], atol=1e-5)
    trainer.train()
    meta = json.load(open(os.path.join(run, "final", "policy.json")))["adapter"]
    assert meta["base"] == os.path.abspath(start) and meta["base_digest"] == weights_digest(start)
    assert load_policy(os.path.join(run, "final")).adapter_base == (meta["base"], meta["base_digest"])


def test_lora_sft_saves_an_adapter_start_that_train_reads_and_a_snapshot_per_check(hf_dir, tmp_path):
    from credo.train.sft_hf import train_hf_sft
    config = HFSFTConfig(start=hf_dir, task_options=CHAIN_SUM_OPTIONS, steps=2, batch_size=2, lr=1e-2,
                         warmup_steps=0, eval_every=1, eval_n=2, max_new_tokens=4, target_accuracy=1.0,
                         lora=LoraSettings(r=4), keep="last", device="cpu")
    out, snapshots = str(tmp_path / "sft"), str(tmp_path / "snap")
    train_hf_sft(config, out, progress=False, snapshots=snapshots)
    assert sorted(f for f in os.listdir(out) if not f.startswith(("sft_", "metrics"))) == ADAPTER_FILES
    assert "lora:" in open(os.path.join(out, "sft_config.yaml")).read()
    assert any(float(v.abs().max()) > 0 for k, v in adapter_tensors(out).items() if "lora_B" in k)
    assert load_policy(out).system_prompt  # the task's format travels with the adapter
    # each validation check's policy is a start of its own (its adapter alone); the last one is what shipped
    assert sorted(os.listdir(snapshots)) == ["step-1", "step-2"]
    last, first = adapter_tensors(out), adapter_tensors(os.path.join(snapshots, "step-1"))
    assert all(torch.equal(v, adapter_tensors(os.path.join(snapshots, "step-2"))[k]) for k, v in last.items())
    assert any(not torch.equal(v, first[k]) for k, v in last.items())
    assert json.load(open(os.path.join(snapshots, "step-1", "sft_summary.json")))["step"] == 1
    assert load_policy(os.path.join(snapshots, "step-1")).adapter_base == load_policy(out).adapter_base


def test_compare_takes_an_adapter_start_and_trains_it_as_the_full_model_it_stands_for(lora_run, tmp_path):
    out = str(tmp_path / "cmp")
    assert main(["compare", "--preset", "smoke", "--start", os.path.join(lora_run, "final"), "--task",
                 "gym:chain_sum", "--methods", "grpo", "--budget", "40", "--jobs", "1", "--set", "audit_n=0",
                 "--set", "premise_n=0", "--out", out, "--yes", "--quiet"]) == 0
    final = os.path.join(out, "runs", "grpo-s0", "final")
    assert os.path.isfile(os.path.join(final, "model.safetensors")) and not os.path.exists(
        os.path.join(final, ADAPTER_WEIGHTS))  # lora.r=0: full weights trained from the merged start


def test_compare_puts_every_run_on_lora_alike_and_a_full_weight_rerun_is_refused(lora_run, tmp_path, capsys):
    out = str(tmp_path / "cmp")
    argv = ["compare", "--preset", "smoke", "--start", os.path.join(lora_run, "final"), "--task", "gym:chain_sum",
            "--methods", "grpo,dr_grpo", "--budget", "40", "--jobs", "1", "--set", "audit_n=0", "--set",
            "premise_n=0", "--out", out, "--yes", "--quiet"]
    assert main([*argv, "--set", "lora.r=2", "--set", "lora.alpha=4"]) == 0
    for method in ("grpo", "dr_grpo"):
        run = os.path.join(out, "runs", f"{method}-s0")
        assert sorted(f for f in os.listdir(os.path.join(run, "final")) if f in ADAPTER_FILES) == ADAPTER_FILES
        assert not os.path.exists(os.path.join(run, "final", "model.safetensors"))
        assert load_train_config(os.path.join(run, "config.yaml"), None).lora == LoraSettings(r=2, alpha=4)
    assert json.load(open(os.path.join(out, "results.json")))["protocol"]["lora"]["r"] == 2
    assert "every run trains LoRA adapters alike (rank 2, alpha 4, dropout 0, on all-linear)" in open(
        os.path.join(out, "report.md")).read()
    # the same grid without LoRA cannot reuse those runs: refused in one line naming the setting
    assert main(argv) == 2
    assert "lora" in capsys.readouterr().err.strip().splitlines()[-1]


def test_compare_refuses_lora_on_a_tiny_start_before_timing_anything(saved_policy, tmp_path, capsys):
    for start in ([], ["--start", saved_policy], ["--start", "sft:arith-long-skilled", "--task", "arith-long"]):
        out = tmp_path / f"cmp{len(start)}"
        assert main(["compare", "--preset", "smoke", *start, "--methods", "grpo", "--budget", "40", "--set",
                     "lora.r=2", "--set", "audit_n=0", "--out", str(out), "--yes", "--quiet"]) == 2
        assert "compare.lora.r=2: LoRA needs a Hugging Face start" in capsys.readouterr().err.strip().splitlines()[-1]
        assert not out.exists()


def test_an_audit_caches_an_adapters_reference_by_its_base_too(lora_run, tmp_path):
    from credo.lab.audit.config import AuditConfig
    from credo.lab.audit.reference import reference_key
    other = str(tmp_path / "other")
    shutil.copytree(os.path.join(lora_run, "final"), other)
    meta = json.load(open(os.path.join(other, "policy.json")))
    meta["adapter"]["base_digest"] = "sha256:" + "1" * 64
    json.dump(meta, open(os.path.join(other, "policy.json"), "w"))
    keys = {path: reference_key(AuditConfig(checkpoint=path, n=4, group_size=2), path, torch.device("cpu"),
                                torch.float32) for path in (os.path.join(lora_run, "final"), other)}
    assert len(set(keys.values())) == 2  # the same adapter weights on two bases: two references


def test_a_compacted_adapter_is_half_the_bytes_and_loads_as_its_weights_rounded(lora_run, tmp_path, capsys):
    import runpy
    final = os.path.join(lora_run, "final")
    out = str(tmp_path / "compact")
    script = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "scripts", "compact_adapter.py"))
    assert script["main"]([final, out]) == 0 and "bfloat16" in capsys.readouterr().out
    original, compact = adapter_tensors(final), adapter_tensors(out)
    assert compact.keys() == original.keys() and all(v.dtype == torch.bfloat16 for v in compact.values())
    def payload(tensors):
        return sum(v.numel() * v.element_size() for v in tensors.values())
    assert 2 * payload(compact) == payload(original)  # the file's header aside, half the bytes
    assert json.load(open(os.path.join(out, "policy.json")))["adapter"]["stored_dtype"] == "bfloat16"
    loaded = {k: v for k, v in load_policy(out).model.named_parameters() if "lora_" in k}
    assert loaded and all(v.dtype == torch.float32 for v in loaded.values())
    rounded = {k: v.to(torch.bfloat16).float() for k, v in original.items()}
    for name, value in loaded.items():  # peft's names carry the adapter's name; the file's do not
        key = name.replace(".default", "")
        assert torch.equal(value.detach(), rounded[key]), name
    assert not all(torch.equal(rounded[k], original[k]) for k in original)  # the rounding is real
    assert script["main"]([final, out]) == 2  # never over what exists
    assert "exists" in capsys.readouterr().err
    assert script["main"]([str(tmp_path), str(tmp_path / "other")]) == 2


def test_peft_reads_the_saved_adapter_as_its_own(lora_run, hf_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    final = os.path.join(lora_run, "final")
    ours = load_policy(final)
    theirs = HFPolicy(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_dir), final).eval(),
                      ours.tokenizer, chat=True)
    ids, mask = ours.encode_prompts(["2 + 3 ="])
    done, done_mask = ours.encode_completions(["<answer>5</answer>"])
    with torch.no_grad():
        assert torch.equal(ours.score(ids, mask, done, done_mask)[0], theirs.score(ids, mask, done, done_mask)[0])
