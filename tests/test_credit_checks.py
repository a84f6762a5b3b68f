"""credo's credit sanity checks (credo.integrations.checks) catch each fault planted on purpose, in both adapters:
a mask shifted by one token, credit on padding, a group split across two processes, a NaN reward (and a NaN
advantage, credit on a masked tool token, a group whose advantages do not sum to 0). Each failure names the
check, the row and the step, and is raised before the trainer gets the advantages; `credit_checks=False` /
`checks=False` lets the same fault through."""

import dataclasses
import threading

import datasets
import numpy as np
import pytest
import torch

from credo import credit as credit_registry
from credo.integrations.checks import CreditCheckError, check_group_sums, Where
from credo.integrations.trl import CreditGRPOTrainer
from credo.integrations.verl import make_verl_estimator
from credo.integrations.verl_credit import apply_credit
from credo.tasks import make_task
from credo.core.protocols import Problem
from builders import ThreadGather, build_tokenizer, tiny_llama, to_dataproto

OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


# --- planted estimator faults, the same in both adapters ------------------------------------------------
def planted(name, fault):
    """The registered estimator `name` with `fault` planted in its credit."""
    spec = credit_registry.get(name)

    def fn(rollouts, probe, config):
        result = spec.fn(rollouts, probe, config)
        a = result.advantages.clone()
        real = rollouts.completion_mask.to(a.device)
        trainable = rollouts.trainable_mask().to(a.device)
        if fault == "padding":  # credit on the padding after each completion
            a = a + 0.5 * (~real).float()
        elif fault == "masked":  # credit on tool tokens the loss leaves out
            a = a + 0.5 * (real & ~trainable).float()
        elif fault == "nan":
            a[1, 0] = float("nan")
        elif fault == "bias":  # every row of every group moved alike: no group sums to 0 any more
            a = a + 0.25 * trainable.float()
        return dataclasses.replace(result, advantages=a)
    return dataclasses.replace(spec, fn=fn)


# --- TRL: fixed completions of different lengths (padding in every batch) through TRL's rollout hook ------
COMPLETIONS = ["Let me add. So it is {a}. <answer>{a}</answer>", "Wait. <answer>0</answer>", "<answer>{a}</answer>",
               "no"]


def trl_trainer(tmp_path, credit="grpo", reward=None, **extra):
    from trl import GRPOConfig
    tokenizer = build_tokenizer()
    task = make_task("gym:chain_sum", OPTIONS)
    problems = task.heldout_problems(2)
    answers = {p.prompt: p.answer for p in problems}

    def rollout(prompts, trainer):
        texts = [COMPLETIONS[j % 4].format(a=answers[p]) for j, p in enumerate(prompts)]
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
        return {"prompt_ids": [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts],
                "completion_ids": ids, "logprobs": [[0.0] * len(c) for c in ids]}

    def verifier(prompts, completions, answer, **kwargs):
        return [task.reward(Problem(key=q, prompt=q, answer=a), c) for q, c, a in zip(prompts, completions, answer)]

    args = GRPOConfig(output_dir=str(tmp_path / credit), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=24, max_steps=1, report_to=[], use_cpu=True, bf16=False, seed=0,
                      save_strategy="no", learning_rate=1e-2, beta=0.0, shuffle_dataset=False)
    return CreditGRPOTrainer(model=tiny_llama(tokenizer, max_positions=256, init_range=0.5), processing_class=tokenizer,
                             reward_funcs=reward or verifier, args=args, rollout_func=rollout, task=task,
                             train_dataset=datasets.Dataset.from_list([{"prompt": p.prompt, "answer": p.answer}
                                                                       for p in problems]), credit=credit, **extra)


def trl_batch(trainer, rows=(0, 0, 0, 0)):
    trainer.model.train()
    return trainer._generate_and_score_completions([trainer.train_dataset[i] for i in rows])


def test_trl_a_clean_batch_passes_the_checks_with_padding_and_a_reward_signal(tmp_path):
    trainer = trl_trainer(tmp_path)
    out = trl_batch(trainer)
    assert not out["completion_mask"].bool().all() and out["advantages"].abs().max() > 0.5  # the plants have teeth


@pytest.mark.parametrize("fault, check", [("padding", "zero_on_padding"), ("nan", "advantages_finite"),
                                          ("bias", "group_sums")])
def test_trl_a_planted_credit_fault_fails_its_check(tmp_path, fault, check):
    trainer = trl_trainer(tmp_path)
    trainer.credit_spec = planted("grpo", fault)
    with pytest.raises(CreditCheckError, match=rf"credo check {check} failed at step 0 \(TRL global_step\), row \d"):
        trl_batch(trainer)


def test_trl_credit_on_padding_passes_when_the_checks_are_off(tmp_path):
    trainer = trl_trainer(tmp_path, credit_checks=False)
    trainer.credit_spec = planted("grpo", "padding")
    out = trl_batch(trainer)
    assert (out["advantages"][~out["completion_mask"].bool()] == 0.5).all()  # what the checks are there to stop


def test_trl_a_mask_shifted_by_one_token_fails_aligned(tmp_path):
    trainer = trl_trainer(tmp_path)
    build = trainer._rollouts

    def shifted(output, probe):  # the credit computed under the completion mask moved one token right
        r = build(output, probe)
        mask = torch.zeros_like(r.completion_mask)
        mask[:, 1:] = r.completion_mask[:, :-1]
        return dataclasses.replace(r, completion_mask=mask)

    trainer._rollouts = shifted
    with pytest.raises(CreditCheckError, match=r"credo check aligned failed at step 0 .*, row 0 .*response mask "
                                               r"that differs from the trainer's at token 0"):
        trl_batch(trainer)


def test_trl_a_group_split_across_two_processes_fails_groups_whole(tmp_path):
    """Process 0's share of a generation batch dealt out of group order: two rows of each of two prompts, where
    TRL's layout puts one whole group (num_generations=4) on each process."""
    trainer = trl_trainer(tmp_path)
    with pytest.raises(CreditCheckError, match=r"credo check groups_whole failed at step 0 .*, row 2 of the "
                                               r"generation batch: the rows of its group 0 hold different prompts"):
        trl_batch(trainer, rows=(0, 0, 1, 1))


def test_trl_a_nan_reward_fails_rewards_finite_and_the_model_is_not_updated(tmp_path):
    def nan_reward(prompts, completions, **kwargs):
        return [float("nan") if i == 2 else float(i % 2) for i in range(len(completions))]

    trainer = trl_trainer(tmp_path, reward=nan_reward)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(CreditCheckError, match=r"credo check rewards_finite failed at step 0 \(TRL global_step\), "
                                               r"row 2 of the generation batch: reward .* is nan"):
        trainer.train()
    assert all(torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    quiet = trl_trainer(tmp_path, reward=nan_reward, credit_checks=False)  # off: read as 0, as before the checks
    quiet._credo_rewards = torch.tensor([[0.0], [1.0], [float("nan")], [1.0]])
    assert float(quiet._local_rewards(4)[0][2]) == 0.0


def test_trl_credit_on_a_tool_token_fails_zero_on_masked(tmp_path, monkeypatch):
    from trl import GRPOTrainer
    trainer = trl_trainer(tmp_path)
    original = GRPOTrainer._generate_and_score_completions

    def with_tool_tokens(self, inputs):
        out = original(self, inputs)
        out["tool_mask"] = torch.ones_like(out["completion_mask"])
        out["tool_mask"][:, 1:3] = 0  # two tool tokens in every completion
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", with_tool_tokens)
    assert trl_batch(trainer)["advantages"][:, 1:3].abs().max() == 0  # clean: no credit there
    trainer.credit_spec = planted("grpo", "masked")
    with pytest.raises(CreditCheckError, match=r"credo check zero_on_masked failed .* row 0 .*token 1, outside"):
        trl_batch(trainer)


# --- verl: apply_credit on a real DataProto (test_verl's batch: 4 groups of 4, rows of different lengths) ---
def verl_credit(policy, task, batch, estimator="grpo", **kwargs):
    return apply_credit(batch, estimator, module=policy.model, tokenizer=policy.tokenizer, task=task, step=7, **kwargs)


@pytest.mark.parametrize("fault, check", [("padding", "zero_on_padding"), ("nan", "advantages_finite"),
                                          ("bias", "group_sums")])
def test_verl_a_planted_credit_fault_fails_its_check(hf_setup, monkeypatch, fault, check):
    policy, task, r = hf_setup
    monkeypatch.setitem(credit_registry.registry.ESTIMATORS._entries, "grpo", planted("grpo", fault))
    with pytest.raises(CreditCheckError, match=rf"credo check {check} failed at step 7, row \d+ \(uid 'uid-\d'\)"):
        verl_credit(policy, task, to_dataproto(r, task, torch.arange(r.batch_size)))
    # off: the fault reaches the (masked) output without a word
    verl_credit(policy, task, to_dataproto(r, task, torch.arange(r.batch_size)), checks=False)


def test_verl_a_response_mask_shifted_by_one_token_fails_aligned(hf_setup):
    policy, task, r = hf_setup
    batch = to_dataproto(r, task, torch.arange(r.batch_size))
    clean = verl_credit(policy, task, to_dataproto(r, task, torch.arange(r.batch_size))).batch["advantages"]
    mask = batch.batch["response_mask"]
    shifted = torch.zeros_like(mask)
    shifted[:, 1:] = mask[:, :-1]
    batch.batch["response_mask"] = shifted
    short = int((mask.sum(1) < mask.shape[1]).nonzero()[0])  # the first row with padding after it
    with pytest.raises(CreditCheckError, match=rf"credo check aligned failed at step 7, row {short} .*the loss mask "
                                               r"marks token \d+, which is padding"):
        verl_credit(policy, task, batch)
    assert clean.abs().max() > 0.5


def test_verl_credit_on_a_masked_tool_token_fails_zero_on_masked(hf_setup, monkeypatch):
    policy, task, r = hf_setup
    batch = to_dataproto(r, task, torch.arange(r.batch_size))
    batch.batch["response_mask"][:, 1:3] = 0  # multi-turn: tool tokens the loss leaves out
    monkeypatch.setitem(credit_registry.registry.ESTIMATORS._entries, "grpo", planted("grpo", "masked"))
    with pytest.raises(CreditCheckError, match=r"credo check zero_on_masked failed at step 7, row 0 .*token 1"):
        verl_credit(policy, task, batch)


def split_shards(policy, task, batch, world=2):
    """Each shard's apply_credit in its own thread (verl's DP dispatch in miniature); the exceptions by shard."""
    chunks, errors, shared = batch.chunk(world), [None] * world, ThreadGather(world)

    def run(rank):
        try:
            verl_credit(policy, task, chunks[rank], gather=shared.for_rank(rank))
        except CreditCheckError as err:
            errors[rank] = err
    threads = [threading.Thread(target=run, args=(k,)) for k in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    return errors


@pytest.mark.parametrize("global_ids", [True, False], ids=["credo_group", "uid"])
def test_verl_a_group_split_across_two_shards_fails_groups_whole(hf_setup, global_ids):
    """Rows dealt so each shard holds two rows of every group: equal group sizes on each shard (the shard-local
    check passes), but every group is normalised over half of its rows."""
    policy, task, r = hf_setup
    halves = [torch.tensor([4 * g + k for g in range(4) for k in ks]) for ks in ((0, 1), (2, 3))]
    batch = to_dataproto(r, task, torch.cat(halves))
    if not global_ids:  # groups known by their uid only
        batch.batch.pop("credo_group")
    errors = split_shards(policy, task, batch)
    for rank, err in enumerate(errors):
        assert err is not None and "credo check groups_whole failed at step 7, row 0 (uid 'uid-0')" in str(err)
        assert "also on another process" in str(err)
    whole = to_dataproto(r, task, torch.arange(r.batch_size))  # the same rows, whole groups per shard: no error
    assert split_shards(policy, task, whole) == [None, None]


def test_verl_rows_of_two_prompts_under_one_uid_fail_groups_whole(hf_setup):
    policy, task, r = hf_setup
    batch = to_dataproto(r, task, torch.arange(r.batch_size))
    batch.batch.pop("credo_group")
    uid = batch.non_tensor_batch["uid"]
    uid[4:6] = "uid-0"  # two rows of group 1 tagged as group 0, two of group 0 as group 1
    uid[2:4] = "uid-1"
    with pytest.raises(CreditCheckError, match=r"groups_whole failed at step 7, row 4 \(uid 'uid-0'\): the rows of "
                                               r"its group 0 hold different prompts"):
        verl_credit(policy, task, batch)


def test_verl_a_nan_reward_is_refused_naming_the_check_field_row_and_step(hf_setup):
    policy, task, r = hf_setup
    batch = to_dataproto(r, task, torch.arange(r.batch_size))
    batch.batch["token_level_rewards"][5, 0] = float("nan")
    with pytest.raises(ValueError, match=r"at step 7: rewards_finite: field 'token_level_rewards', row 5 "
                                         r"\(uid 'uid-1'\), sums to nan"):
        verl_credit(policy, task, batch)


# --- verl's registered reward-only estimators ------------------------------------------------------------
def reward_only_batch(B=8, T=5):
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(B, T)
    mask[::2, 3:] = 0
    rewards = torch.zeros(B, T)
    rewards[:, 2] = torch.randint(0, 2, (B,), generator=g).float()
    rewards[0, 2], rewards[1, 2] = 1.0, 0.0
    index = np.array([f"uid-{i // 4}" for i in range(B)], dtype=object)
    return rewards, mask, index


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_verl_reward_only_estimators_pass_their_checks_and_a_nan_reward_names_its_row(name):
    rewards, mask, index = reward_only_batch()
    advantages, _ = make_verl_estimator(name)(rewards, mask, index)
    assert advantages.abs().max() > 0.1
    rewards[3, 2] = float("nan")  # before: its group's advantages were all 0, silently
    with pytest.raises(ValueError, match=r"at step 1 \(call 1 of credo_\w+ in this process\): rewards_finite: field "
                                         r"'token_level_rewards', row 3 \(uid 'uid-0'\), sums to nan"):
        make_verl_estimator(name)(rewards, mask, index)


def test_group_sums_tolerance_passes_float32_groups_and_fails_a_one_row_fault():
    """The tolerance (checks module docstring): float32 GRPO groups of 2..64 rows pass; a group whose statistics
    took in one row too many (a padding row's reward 0: the smallest fault it is there for) fails at 64 rows too."""
    from credo.core.groups import grpo_advantages
    g = torch.Generator().manual_seed(1)
    where = Where(step=0, off="-")
    for size in (2, 7, 64):
        rewards = torch.rand(size, generator=g)
        group = torch.zeros(size, dtype=torch.long)
        a = grpo_advantages(rewards, group)
        check_group_sums(a[:, None].expand(size, 3), torch.ones(size, 3), group, where)
        wrong = grpo_advantages(torch.cat([rewards, torch.zeros(1)]), torch.zeros(size + 1, dtype=torch.long))[:size]
        with pytest.raises(CreditCheckError, match="group_sums"):
            check_group_sums(wrong[:, None].expand(size, 3), torch.ones(size, 3), group, where)


@pytest.mark.slow
def test_trl_two_real_processes_dealt_a_split_group_stop_before_the_update(tmp_path):
    """accelerate launch, 2 CPU processes (gloo): the generation batch dealt out of group order (each process holds
    half of both groups) stops at credo's groups_whole check on both processes, before any update is written."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": os.pathsep.join([os.path.join(root, "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "split"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes=2", "--num_machines=1",
           "--mixed_precision=no", "--dynamo_backend=no", "--main_process_port=29547",
           os.path.join(root, "examples", "trl_two_process.py"), "--out", str(out), "--per-device", "4",
           "--credit", "grpo", "--deal-split"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    assert ("credo check groups_whole failed at step 0 (TRL global_step), row 2 of the generation batch: the rows of "
            "its group 0 hold different prompts") in result.stderr, result.stderr[-3000:]
    assert "row 6 of the generation batch: the rows of its group 1 hold different prompts" in result.stderr
    assert not (out / "grpo.json").exists()


def test_the_checks_are_reachable_as_credo_checks_and_one_verl_config_key_turns_them_off():
    import credo
    from omegaconf import OmegaConf
    from credo.integrations import checks
    from credo.integrations.verl_credit import credo_spec
    assert credo.checks is checks
    config = {"algorithm": {"adv_estimator": "credo:grpo"}, "credo": {"task": "gym:chain_sum"}}
    assert "checks" not in credo_spec(OmegaConf.create(config))  # on by default (the worker reads a missing key so)
    off = credo_spec(OmegaConf.create({**config, "credo": {"task": "gym:chain_sum", "checks": False}}))
    assert off["checks"] is False
    with pytest.raises(ValueError, match="credo.checks must be true or false, got 'no'"):
        credo_spec(OmegaConf.create({**config, "credo": {"task": "gym:chain_sum", "checks": "no"}}))


def test_credo_checks_is_an_importable_module():
    """`import credo.checks` and `from credo.checks import ...` (before: only an attribute, so both failed), in a
    fresh interpreter, without `import credo` loading torch."""
    import os
    import subprocess
    import sys
    code = ("import sys, credo\n"
            "assert 'torch' not in sys.modules\n"
            "import credo.checks\n"
            "from credo.checks import CreditCheckError, check_advantages\n"
            "from credo.integrations import checks\n"
            "assert credo.checks is checks and CreditCheckError is checks.CreditCheckError\n"
            "print('ok')\n")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": src})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# --- the opt-in masked-perturbation invariance check (leak_check.py) in both adapters --------------------
def leaky(name):
    """The registered estimator `name` with the padding's token ids planted in its credit of real tokens (a sum
    over all T positions): zero on padding, so only the leak check sees it."""
    spec = credit_registry.get(name)

    def fn(rollouts, probe, config):
        result = spec.fn(rollouts, probe, config)
        ids = rollouts.completion_ids.float().sum(1, keepdim=True)
        return dataclasses.replace(result, advantages=result.advantages + 1e-4 * ids * rollouts.completion_mask)
    return dataclasses.replace(spec, fn=fn)


@pytest.mark.parametrize("credit", ["grpo", "entropy_mask"])
def test_trl_the_leak_check_passes_credo_estimators_and_catches_a_planted_leak(tmp_path, credit):
    trainer = trl_trainer(tmp_path, credit=credit, leak_check=True)
    clean = trl_batch(trainer)["advantages"]
    assert torch.equal(clean, trl_batch(trl_trainer(tmp_path, credit=credit))["advantages"])  # the check changes none
    trainer.credit_spec = leaky(credit)
    with pytest.raises(CreditCheckError, match=r"credo check masked_invariance failed at step 0 \(TRL global_step\), "
                                               r"row \d of the generation batch: refilling .* leaks into valid credit; "
                                               r"the update was not applied \(leak_check=False turns"):
        trl_batch(trainer)
    trainer.leak_check = False
    trainer.credit_checks = False
    trl_batch(trainer)  # off: the leak goes through


@pytest.mark.parametrize("estimator", ["grpo", "sc_grpo"])
def test_verl_the_leak_check_passes_credo_estimators_and_catches_a_planted_leak(hf_setup, monkeypatch, estimator):
    policy, task, r = hf_setup
    order = torch.arange(r.batch_size)
    checked = verl_credit(policy, task, to_dataproto(r, task, order), estimator, leak_check=True)
    plain = verl_credit(policy, task, to_dataproto(r, task, order), estimator)
    assert torch.equal(checked.batch["advantages"], plain.batch["advantages"])
    monkeypatch.setitem(credit_registry.registry.ESTIMATORS._entries, estimator, leaky(estimator))
    with pytest.raises(CreditCheckError, match=r"credo check masked_invariance failed at step 7, row \d+ \(uid "
                                               r"'uid-\d'\): .*\+credo.leak_check=false turns"):
        verl_credit(policy, task, to_dataproto(r, task, order), estimator, leak_check=True)


def test_one_verl_config_key_turns_the_leak_check_on():
    from omegaconf import OmegaConf
    from credo.integrations.verl_credit import credo_spec
    config = {"algorithm": {"adv_estimator": "credo:grpo"}, "credo": {"task": "gym:chain_sum"}}
    assert "leak_check" not in credo_spec(OmegaConf.create(config))  # off by default
    on = credo_spec(OmegaConf.create({**config, "credo": {"task": "gym:chain_sum", "leak_check": True}}))
    assert on["leak_check"] is True
    with pytest.raises(ValueError, match="credo.leak_check must be true or false, got 'yes'"):
        credo_spec(OmegaConf.create({**config, "credo": {"task": "gym:chain_sum", "leak_check": "yes"}}))
