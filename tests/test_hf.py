"""The Hugging Face backend on a tiny random Llama with a tokenizer built by builders.py (no hub access)."""

import os
import random

import pytest
import torch

from credo import credit  # noqa: E402
from credo.core.protocols import SamplingConfig, rewards_for  # noqa: E402
from credo.core.probe import Probe  # noqa: E402
from credo.strategies.localisers import localise  # noqa: E402
from credo.core.rollouts import Rollouts  # noqa: E402


def test_sampling_matches_scoring_with_left_padding_and_cache(hf_policy):
    ids, mask = hf_policy.encode_prompts(["2 + 3 =",
                                          "State the final answer to the following arithmetic problem: 4 - 1 ="])
    assert not mask[0, 0] and mask[0, -1]  # left-padded
    out = hf_policy.sample(ids, mask, SamplingConfig(max_new_tokens=12), torch.Generator().manual_seed(0))
    with torch.no_grad():
        lp, _ = hf_policy.score(ids, mask, out.completion_ids, out.completion_mask)
    assert torch.allclose(lp, out.logprobs, atol=1e-4)
    assert (lp[~out.completion_mask] == 0).all()


def gym_rollouts(policy, task):
    problems = task.train_problems(2, torch.Generator().manual_seed(0))
    texts = []
    for p in problems:
        texts += [f"Let me add. So it is {p.answer}. <answer>{p.answer}</answer>", "Wait. <answer>0</answer>",
                  f"Therefore\n\n<answer>{p.answer}</answer>", "no idea"]
    rows = [p for p in problems for _ in range(4)]
    p_ids, p_mask = policy.encode_prompts([p.prompt for p in rows])
    ids, mask = policy.encode_completions(texts)
    rewards, correct = rewards_for(task, rows, texts)
    with torch.no_grad():
        old, _ = policy.score(p_ids, p_mask, ids, mask)
    return Rollouts(p_ids, p_mask, ids, mask, torch.arange(2).repeat_interleave(4), rewards, old, correct, rows, texts)


@pytest.mark.parametrize("name", sorted(credit.names()))
def test_every_estimator_runs_through_the_hf_backend(hf_policy, gym_task, name):
    r = gym_rollouts(hf_policy, gym_task)
    assert r.correct.any() and not r.correct.all()
    spec = credit.get(name)
    options = {"k": 2} if name in ("vineppo", "spo_chain") else {}
    if name in ("oar",):
        options = {"unit": "segment"}
    if "segmenter" in {f for f in spec.config_cls.__dataclass_fields__}:
        options["segmenter"] = "keyword_entropy"
    probe = Probe(hf_policy, gym_task, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(0))
    out = spec(r, probe, spec.make_config(options))
    assert torch.isfinite(out.advantages).all()
    assert (out.advantages[~r.completion_mask] == 0).all()


@pytest.mark.parametrize("localiser", ["value", "prompt"])
def test_reset_localisers_run_through_the_hf_backend(hf_policy, gym_task, localiser):
    r = gym_rollouts(hf_policy, gym_task)
    probe = Probe(hf_policy, gym_task, SamplingConfig(max_new_tokens=6), torch.Generator().manual_seed(0))
    seg = probe.segment(r, "keyword_entropy")
    rows = [i for i in range(r.batch_size) if not bool(r.correct[i])]
    picks = localise(localiser, r, rows, probe, seg, random.Random(0), prompt_max_new_tokens=16)
    counts = [int((seg[i] >= 0).sum() and seg[i].max() + 1) for i in rows]
    assert all(0 <= k < max(n, 1) for k, n in zip(picks, counts))


def test_lora_step_changes_only_adapter_weights(hf_policy, gym_task):
    from credo.core.loss import LossConfig, policy_loss
    from credo.policy.adapters import LoraSettings
    policy = hf_policy.copy()
    policy.add_lora(LoraSettings(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    r = gym_rollouts(policy, gym_task)
    adv = credit.get("grpo")(r).advantages
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    lp, _ = policy.score(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    loss, _ = policy_loss(lp, r.old_logprobs, adv, r.completion_mask, LossConfig(), 32)
    loss.backward()
    opt.step()
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and all("lora_" in n for n in changed)


def test_lora_adapters_are_saved_without_pickle_and_restored_on_resume(hf_policy, tmp_path):
    from credo.policy.adapters import ADAPTER_WEIGHTS, LoraSettings
    from credo.core.state_io import CorruptStateError
    settings, base = LoraSettings(r=4, alpha=8, target_modules=("q_proj", "v_proj")), ("model", "sha256:0")
    trained = hf_policy.copy()
    trained.add_lora(settings, base=base)
    with torch.no_grad():
        for name, p in trained.model.named_parameters():
            if "lora_" in name:
                p.add_(0.01 * torch.randn_like(p))
    trained.save_into(str(tmp_path / "ckpt"))
    assert sorted(f for f in os.listdir(tmp_path / "ckpt") if f.endswith(".safetensors")) == [ADAPTER_WEIGHTS]
    resumed = hf_policy.copy()
    resumed.add_lora(settings, seed=1, base=base)
    resumed.load_weights_from(str(tmp_path / "ckpt"))
    want = dict(trained.model.named_parameters())
    lora = [n for n, _ in resumed.model.named_parameters() if "lora_" in n]
    assert lora and all(torch.equal(p, want[n]) for n, p in resumed.model.named_parameters() if n in lora)
    os.remove(tmp_path / "ckpt" / ADAPTER_WEIGHTS)
    with pytest.raises(CorruptStateError, match=ADAPTER_WEIGHTS):
        resumed.load_weights_from(str(tmp_path / "ckpt"))


def test_system_prompt_and_reference_context(hf_policy, gym_task):
    from credo.policy import bind_task
    policy = bind_task(hf_policy.copy(), gym_task)
    text = policy.format_prompt(gym_task.reference_prompt(gym_task.heldout_problems(1)[0], "SOLUTION"))
    assert text.startswith("<|system|>") and "SOLUTION" in text.split("<|user|>")[0]
    assert "<answer>" in text.split("<|user|>")[0]  # the task's answer format rides in the system prompt


def test_completion_logits_keep_only_completion_positions_and_match_the_full_forward(hf_policy):
    """The LM head runs over the last T + 1 positions only; the logits are those of the full forward."""
    prompt_ids, prompt_mask = hf_policy.encode_prompts(["3 + 4 =", "State the final answer: 4 - 1 - 7 ="])
    completion_ids, completion_mask = hf_policy.encode_completions(["So 3 + 4 = 7", "<answer>-4</answer>"])
    kept = hf_policy.completion_logits(prompt_ids, prompt_mask, completion_ids, completion_mask)
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    full = hf_policy.forward_logits(torch.cat([prompt_ids, completion_ids], 1),
                                    torch.cat([prompt_mask, completion_mask], 1))[:, P - 1:P + T - 1]
    assert kept.shape == (2, T, full.shape[-1])
    assert torch.allclose(kept, full, atol=1e-5)


def test_rows_sharing_a_prompt_read_it_once_with_the_same_logits_and_gradients(hf_policy):
    """A GRPO-shaped batch (2 prompts x 3 completions, ragged lengths): the shared-prompt forward gives the
    full forward's logits and parameter gradients."""
    prompts = ["3 + 4 =", "State the final answer: 4 - 1 - 7 ="]
    completions = ["So 3 + 4 = 7", "<answer>7</answer>", "Let me add", "4 - 1 = 3\n3 - 7 = -4", "-4", "<answer>-4"]
    prompt_ids, prompt_mask = hf_policy.encode_prompts([p for p in prompts for _ in range(3)])
    completion_ids, completion_mask = hf_policy.encode_completions(completions)
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    results = []
    for share in (True, False):
        hf_policy.share_prompts = share
        hf_policy.model.zero_grad(set_to_none=True)
        logprobs, _ = hf_policy.score(*args)
        logprobs.sum().backward()
        results.append((logprobs.detach(), [p.grad.clone() for p in hf_policy.model.parameters()]))
    hf_policy.share_prompts = True
    hf_policy.model.zero_grad(set_to_none=True)
    assert hf_policy.shared_prompt_logits(*args) is not None  # the shared path ran
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(results[0][1], results[1][1]))
    distinct = hf_policy.encode_prompts(prompts)
    assert hf_policy.shared_prompt_logits(*distinct, completion_ids[:2], completion_mask[:2]) is None


def test_sampling_a_group_reads_its_prompt_once_and_samples_the_same_tokens(hf_policy):
    prompt_ids, prompt_mask = hf_policy.encode_prompts(["3 + 4 =", "3 + 4 =",
                                                        "State the final answer: 4 - 1 - 7 ="] * 2)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)
    outs = []
    for share in (True, False):
        hf_policy.share_prompts = share
        outs.append(hf_policy.sample(prompt_ids, prompt_mask, sampling, torch.Generator().manual_seed(3)))
    hf_policy.share_prompts = True
    assert torch.equal(outs[0].completion_ids, outs[1].completion_ids)
    assert torch.equal(outs[0].completion_mask, outs[1].completion_mask)
    assert torch.allclose(outs[0].logprobs, outs[1].logprobs, atol=1e-5)


def test_the_preallocated_kv_cache_samples_exactly_what_dynamic_cache_samples(hf_policy, monkeypatch):
    """hf_cache writes keys in place instead of concatenating: the same numbers in the same order, so sampling
    (shared prompts gathered to their rows included) must be bit-identical to transformers' DynamicCache."""
    from transformers import DynamicCache

    import credo.policy.hf_cache as hf_cache
    prompt_ids, prompt_mask = hf_policy.encode_prompts(["3 + 4 =", "3 + 4 =", "State the final answer: 4 - 1 - 7 ="])
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16)
    writes, original = [], hf_cache.PreallocatedLayer.update

    def counted(self, keys, values, *args, **kwargs):  # the sampler really writes through PreallocatedLayer
        writes.append(keys.shape[-2])
        return original(self, keys, values, *args, **kwargs)

    monkeypatch.setattr(hf_cache.PreallocatedLayer, "update", counted)
    preallocated = hf_policy.sample(prompt_ids, prompt_mask, sampling, torch.Generator().manual_seed(5))
    assert len(writes) > 4
    monkeypatch.undo()
    monkeypatch.setattr(hf_cache, "preallocated_cache", lambda capacity: DynamicCache())
    dynamic = hf_policy.sample(prompt_ids, prompt_mask, sampling, torch.Generator().manual_seed(5))
    assert preallocated.completion_ids.shape[1] > 4  # several decode steps ran through the cache
    assert torch.equal(preallocated.completion_ids, dynamic.completion_ids)
    assert torch.equal(preallocated.logprobs, dynamic.logprobs)


def test_a_preallocated_cache_layer_grows_past_its_capacity_and_gathers_rows():
    from credo.policy.hf_cache import PreallocatedLayer
    layer = PreallocatedLayer(capacity=3)
    keys = torch.randn(2, 1, 5, 4)
    values = torch.randn(2, 1, 5, 4)
    out_k, out_v = layer.update(keys[:, :, :2], values[:, :, :2])
    assert layer.key_buffer.shape[2] == 3 and torch.equal(out_k, keys[:, :, :2])
    for t in range(2, 5):  # past the capacity: the buffers grow and keep what was written
        out_k, out_v = layer.update(keys[:, :, t:t + 1], values[:, :, t:t + 1])
    assert torch.equal(out_k, keys) and torch.equal(out_v, values) and layer.get_seq_length() == 5
    layer.batch_select_indices(torch.tensor([1, 1, 0]))
    assert torch.equal(layer.keys, keys[[1, 1, 0]]) and torch.equal(layer.values, values[[1, 1, 0]])


def test_a_preallocated_layer_reorders_repeats_and_crops_its_buffers_not_only_its_views():
    """Each of these replaces the views; the next write must see the same rows and length (DynamicLayer's own
    reorder_cache would reorder the views only, and the write after it would bring the old order back)."""
    from credo.policy.hf_cache import PreallocatedLayer
    keys, values = torch.randn(2, 1, 4, 3), torch.randn(2, 1, 4, 3)
    layer = PreallocatedLayer(capacity=8)
    layer.update(keys[:, :, :3], values[:, :, :3])
    layer.reorder_cache(torch.tensor([1, 0]))
    out_k, _ = layer.update(keys[:, :, 3:], values[:, :, 3:])
    assert torch.equal(out_k[:, :, :3], keys[[1, 0], :, :3]) and torch.equal(out_k[:, :, 3:], keys[:, :, 3:])
    layer.crop(-2)  # drop the last two columns: the next write lands at column 2
    out_k, _ = layer.update(keys[:, :, :1], values[:, :, :1])
    assert out_k.shape[2] == 3 and torch.equal(out_k[:, :, 2:], keys[:, :, :1])
    layer.batch_repeat_interleave(2)
    out_k, _ = layer.update(keys[[0, 0, 1, 1], :, 1:2], values[[0, 0, 1, 1], :, 1:2])
    assert out_k.shape == (4, 1, 4, 3) and torch.equal(out_k[0], out_k[1]) and torch.equal(out_k[2], out_k[3])
    with pytest.raises(NotImplementedError):
        layer.offload()


def test_a_model_loads_and_samples_without_transformers_deprecation_warnings(hf_dir, monkeypatch):
    """credo passes the weights' dtype by the keyword the installed transformers takes (`dtype` on the pinned 5.x,
    which warns on `torch_dtype`; `torch_dtype` on a 4.x before 4.56, an older GPU machine's) and reads a forward's
    KV cache as `cache` (5.x warns on `past_key_values`); peft's wrapping is quiet too. Every transformers logger's
    warning_once (set on the logging.Logger class) and every Python warning is recorded."""
    import logging
    import warnings

    import transformers

    from credo.policy.adapters import LoraSettings
    from credo.policy.device import dtype_argument
    from credo.policy.hf import HFPolicy
    said = []
    monkeypatch.setattr(logging.Logger, "warning_once", lambda self, message, *a, **k: said.append(str(message)),
                        raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = HFPolicy.from_pretrained(hf_dir)
        ids, mask = policy.encode_prompts(["2 + 3 =", "2 + 3 =", "4 - 1 ="])  # a shared prompt and another
        out = policy.sample(ids, mask, SamplingConfig(max_new_tokens=4), torch.Generator().manual_seed(0))
        assert policy.shared_prompt_logits(ids, mask, out.completion_ids, out.completion_mask) is not None
        policy.add_lora(LoraSettings(r=2, alpha=4))
    said += [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert not [m for m in said if "deprecated" in m], said
    assert dtype_argument(torch.bfloat16) == {"dtype": torch.bfloat16}
    monkeypatch.setattr(transformers, "__version__", "4.55.2")
    assert dtype_argument(torch.bfloat16) == {"torch_dtype": torch.bfloat16}
