"""credo in verl, against a real verl 0.9.1 import (protocol + core_algos install on CPU: see the Makefile).

A real DataProto batch is built from a tiny random HF Llama (completions tokenised and scored by it, rows
shuffled as verl's balance_batch does); apply_credit must equal verl's own GRPO and credo's own trainer's
credit, and splitting the batch into data-parallel shards must not change any advantage.
"""

import threading

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo import core_algos

from credo.integrations.verl import make_verl_estimator
from credo.integrations.verl_credit import apply_credit, credit_on_shards, dataset_row, folded_advantages
from builders import CHAIN_SUM_OPTIONS, ThreadGather, shuffled_order, to_dataproto

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("norm", [True, False])
def test_credo_grpo_estimator_equals_verls_grpo(seed, norm):
    g = torch.Generator().manual_seed(seed)
    B, T = 24, 7
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), torch.randint(0, T, (B,), generator=g)] = torch.randint(0, 2, (B,), generator=g).float()
    index = np.array([f"uid-{i}" for i in torch.randint(0, 7, (B,), generator=g).tolist()], dtype=object)
    ours, ret = make_verl_estimator("grpo" if norm else "dr_grpo")(rewards, mask, index, 1e-6, norm)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, index, 1e-6, norm)
    assert (ours - theirs).abs().max() <= 1e-6 and torch.equal(ours, ret)


def test_credo_grpo_reads_the_std_flag_from_the_algorithm_config_as_verl_calls_it():
    """verl passes norm_adv_by_std_in_grpo to its own GRPO only; a registered estimator gets `config`."""
    from omegaconf import OmegaConf
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(8, 3)
    rewards = torch.zeros(8, 3)
    rewards[:, -1] = torch.randint(0, 2, (8,), generator=g).float()
    index = np.array([f"uid-{i // 4}" for i in range(8)], dtype=object)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": False})
    ours, _ = make_verl_estimator("grpo")(token_level_rewards=rewards, response_mask=mask, index=index, config=config)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, index, 1e-6, False)
    assert (ours - theirs).abs().max() <= 1e-6


def test_model_estimators_refused_by_the_reward_only_signature():
    with pytest.raises(ValueError, match="needs the model"):
        make_verl_estimator("rredcot")


def credo_trainer_credit(policy, task, r, method, tmp_path):
    from credo.train.trainer import Trainer
    from credo.train.config import TrainConfig
    trainer = Trainer(TrainConfig(method=method, task="gym:chain_sum", task_options=CHAIN_SUM_OPTIONS, start="unused"),
                      str(tmp_path / method), policy=policy, progress=False)
    return folded_advantages(trainer.assign_credit(r))


def test_apply_credit_grpo_equals_verls_grpo(hf_setup):
    policy, task, r = hf_setup
    order = shuffled_order(r.batch_size)
    batch = apply_credit(to_dataproto(r, task, order), "grpo", module=policy.model,
                         tokenizer=policy.tokenizer, task=task)
    t = batch.batch
    expected, _ = core_algos.compute_grpo_outcome_advantage(t["token_level_rewards"], t["response_mask"],
                                                            batch.non_tensor_batch["uid"])
    assert r.rewards.std() > 0 and expected.abs().max() > 0.5
    assert (t["advantages"] - expected).abs().max() <= 1e-6 and torch.equal(t["advantages"], t["returns"])


@pytest.mark.parametrize("method", ["rredcot", "sc_grpo"])
def test_apply_credit_equals_credo_trainers_credit(hf_setup, method, tmp_path):
    policy, task, r = hf_setup
    # rows shuffled as balance_batch does; SC-GRPO draws each row's reference from its group in row order,
    # so for it the same rows in another order are a different (equally likely) draw: keep credo's order
    order = shuffled_order(r.batch_size) if method == "rredcot" else torch.arange(r.batch_size)
    expected = credo_trainer_credit(policy, task, r, method, tmp_path)[order]
    # seed 3 = the trainer's probe generator at its first step (run seed + 3): SC-GRPO draws its per-step
    # reference seed from it
    batch = apply_credit(to_dataproto(r, task, order), method, module=policy.model,
                         tokenizer=policy.tokenizer, task=task, seed=3)
    ours = batch.batch["advantages"]
    grpo_only = credo_trainer_credit(policy, task, r, "grpo", tmp_path)[order]
    assert (expected - grpo_only).abs().max() > 1e-3  # the estimator moved credit: the comparison has teeth
    assert (ours - expected).abs().max() <= 1e-6
    assert batch.batch["credo_cost"][0, 0] > 0


# lambda_grpo is left out: these groups' completions differ from their first token, so its weights are all 1
@pytest.mark.parametrize("method", ["tempo", "entropy_mask", "gtpo", "otb"])
def test_apply_credit_runs_the_issue_38_estimators_as_credos_trainer_does(hf_setup, method, tmp_path):
    policy, task, r = hf_setup
    order = shuffled_order(r.batch_size)  # balance_batch's reordering: none of them depends on the row order
    expected = credo_trainer_credit(policy, task, r, method, tmp_path)[order]
    batch = apply_credit(to_dataproto(r, task, order), method, module=policy.model, tokenizer=policy.tokenizer,
                         task=task)
    grpo_only = credo_trainer_credit(policy, task, r, "grpo", tmp_path)[order]
    assert (expected - grpo_only).abs().max() > 1e-3  # the estimator moved credit: the comparison has teeth
    assert (batch.batch["advantages"] - expected).abs().max() <= 1e-5


def dispatch(policy, task, world, gather=True):
    """verl's DP dispatch in miniature: DataProto.chunk(world), one thread per shard, DataProto.concat."""
    def call(data):
        chunks, outs, shared = data.chunk(world), [None] * world, ThreadGather(world)

        def run(rank):
            outs[rank] = apply_credit(chunks[rank], data.meta_info["credo"]["estimator"], module=policy.model,
                                      tokenizer=policy.tokenizer, task=task,
                                      config=data.meta_info["credo"].get("credit"),
                                      gather=shared.for_rank(rank) if gather else None)
        threads = [threading.Thread(target=run, args=(k,)) for k in range(world)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return DataProto.concat(outs)
    return call


def test_prefix_shaping_with_the_credit_localiser_on_shards_without_a_row_to_shape(hf_setup):
    """4 shards, one group each: the all-wrong group's shard has no row to shape, yet runs the credit
    localiser's RREDCoT, whose standardisation is a collective; the advantages equal one shard's."""
    policy, task, r = hf_setup
    order = shuffled_order(r.batch_size, seed=3)
    # 3-token segments: the fixture's wrong traces are one line each
    spec = {"estimator": "prefix_shaping", "credit": {"localiser": "credit", "credit_method": "rredcot",
                                                      "segmenter": {"name": "fixed", "n": 3}}}
    one = credit_on_shards(to_dataproto(r, task, order), spec, dispatch(policy, task, 1), 1).batch["advantages"]
    four = credit_on_shards(to_dataproto(r, task, order), spec, dispatch(policy, task, 4), 4).batch["advantages"]
    assert (four - one).abs().max() <= 1e-6 * max(1.0, float(one.abs().max()))
    grpo = credit_on_shards(to_dataproto(r, task, order), {"estimator": "grpo"}, dispatch(policy, task, 1), 1)
    assert (one - grpo.batch["advantages"]).abs().max() > 1e-3  # some wrong trace's prefix was shaped


@pytest.mark.parametrize("method", ["grpo", "rredcot", "sc_grpo", "entropy_mask"])
def test_two_shards_give_the_same_advantages_as_one(hf_setup, method):
    policy, task, r = hf_setup
    order = shuffled_order(r.batch_size, seed=3)
    spec = {"estimator": method}
    one = credit_on_shards(to_dataproto(r, task, order), spec, dispatch(policy, task, 1), 1).batch["advantages"]
    two = credit_on_shards(to_dataproto(r, task, order), spec, dispatch(policy, task, 2), 2)
    # relative: SC-GRPO's per-sequence mean-1 weights scale float32 noise of the shards' padded passes
    assert (two.batch["advantages"] - one).abs().max() <= 1e-6 * max(1.0, float(one.abs().max()))
    assert two.meta_info["credo_tokens_scored"] > 0 or method == "grpo"
    if method == "rredcot":  # without the gather each shard standardises alone: the test would catch that
        alone = credit_on_shards(to_dataproto(r, task, order), spec, dispatch(policy, task, 2, gather=False), 2)
        assert (alone.batch["advantages"] - one).abs().max() > 1e-3


def test_uneven_groups_over_shards_fail_with_one_line(hf_setup):
    policy, task, r = hf_setup
    with pytest.raises(ValueError, match="group count divisible by 3"):
        credit_on_shards(to_dataproto(r, task, shuffled_order(r.batch_size)), {"estimator": "grpo"},
                         dispatch(policy, task, 3), 3)


def test_worker_mixin_is_registered_with_verls_dispatch():
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from credo.integrations.verl_worker import CredoCreditWorkerMixin
    attrs = getattr(CredoCreditWorkerMixin.credo_compute_advantage, MAGIC_ATTR)
    assert set(attrs["dispatch_mode"]) == {"dispatch_fn", "collect_fn"} and attrs["blocking"]


class FakeEngine:
    """The slice of verl's engine the worker mixin uses: streamed HF weights and the DP group."""

    def __init__(self, model):
        self.model = model

    def get_per_tensor_param(self):
        return ((name, t.detach().clone()) for name, t in self.model.state_dict().items()), None

    def get_data_parallel_group(self):
        return None


def test_worker_mixin_scores_with_a_streamed_copy_of_the_actor(hf_setup):
    """credo_compute_advantage as a worker runs it (ray's dispatch bypassed): a fresh HF model built from the
    actor's config, weights streamed from the engine, credit equal to apply_credit on the actor itself."""
    from types import SimpleNamespace
    from credo.integrations.verl_worker import CredoCreditWorkerMixin
    policy, task, r = hf_setup

    class Worker(CredoCreditWorkerMixin):
        credo_module_dtype = torch.float32

    worker = Worker()
    worker.actor = SimpleNamespace(engine=FakeEngine(policy.model),
                                   model_config=SimpleNamespace(tokenizer=policy.tokenizer,
                                                                hf_config=policy.model.config))
    data = to_dataproto(r, task, torch.arange(r.batch_size))
    data.meta_info["credo"] = {"estimator": "rredcot", "task": "gym:chain_sum", "task_options": CHAIN_SUM_OPTIONS}
    out = CredoCreditWorkerMixin.credo_compute_advantage.__wrapped__(worker, data)
    expected = apply_credit(to_dataproto(r, task, torch.arange(r.batch_size)), "rredcot", module=policy.model,
                            tokenizer=policy.tokenizer, task=task).batch["advantages"]
    assert worker._credo_module is not policy.model
    assert (out.batch["advantages"] - expected).abs().max() <= 1e-6 and expected.abs().max() > 0.5


def test_a_weight_stream_whose_names_do_not_match_is_refused_not_scored_with_random_weights(hf_setup):
    from types import SimpleNamespace
    from credo.integrations.verl_worker import CredoCreditWorkerMixin
    policy, _, _ = hf_setup

    class Prefixed(FakeEngine):  # e.g. an engine that streams "module."-prefixed names
        def get_per_tensor_param(self):
            return ((f"module.{n}", t.detach().clone()) for n, t in self.model.state_dict().items()), None

    class Worker(CredoCreditWorkerMixin):
        credo_module_dtype = torch.float32

    worker = Worker()
    worker.actor = SimpleNamespace(engine=Prefixed(policy.model),
                                   model_config=SimpleNamespace(tokenizer=policy.tokenizer,
                                                                hf_config=policy.model.config))
    with pytest.raises(RuntimeError, match="got no streamed weights"):
        worker._credo_synced_module()
    worker.actor.engine = FakeEngine(policy.model)
    assert worker._credo_synced_module() is worker._credo_module  # the matching stream passes


def test_dataset_rows_survive_parquet_and_score_with_the_tasks_verifier(hf_setup, tmp_path):
    import pandas as pd
    from credo.integrations.verl_credit import compute_score, problems_from_batch
    _, task, r = hf_setup
    problems = task.heldout_problems(3)
    pd.DataFrame([dataset_row(task, p) for p in problems]).to_parquet(tmp_path / "train.parquet")
    rows = pd.read_parquet(tmp_path / "train.parquet")
    for p, (_, row) in zip(problems, rows.iterrows()):
        extra, gold = dict(row["extra_info"]), row["reward_model"]["ground_truth"]
        assert row["prompt"][0]["content"] == task.system_prompt and row["prompt"][1]["content"] == p.prompt
        assert compute_score("credo", f"So <answer>{gold}</answer>", gold, extra) == 1.0
        assert compute_score("credo", f"So <answer>{int(gold) + 1}</answer>", gold, extra) == 0.0
    batch = to_dataproto(r, task, torch.arange(r.batch_size))
    assert [p.answer for p in problems_from_batch(batch, None)] == [p.answer for p in r.problems]


def test_a_shard_with_a_cut_group_is_refused(hf_setup):
    policy, task, r = hf_setup
    cut = to_dataproto(r, task, torch.arange(r.batch_size))[2:]  # the first group loses two rows
    with pytest.raises(ValueError, match="whole groups"):
        apply_credit(cut, "grpo", module=policy.model, tokenizer=policy.tokenizer, task=task)


def test_credo_spec_reads_the_estimator_and_the_top_level_credo_key():
    from omegaconf import OmegaConf
    from credo.integrations.verl_credit import credo_spec
    config = OmegaConf.create({"algorithm": {"adv_estimator": "credo:rredcot"},
                               "credo": {"task": "gym:chain_sum", "credit": {"lam": 0.5}}})
    assert credo_spec(config) == {"estimator": "rredcot", "task": "gym:chain_sum", "task_options": {},
                                  "credit": {"lam": 0.5}, "seed": 0}
    assert credo_spec(OmegaConf.create({"algorithm": {"adv_estimator": "grpo"}})) is None
    with pytest.raises(ValueError, match=r"\+credo.task"):
        credo_spec(OmegaConf.create({"algorithm": {"adv_estimator": "credo:sc_grpo"}}))


@pytest.mark.parametrize("method", ["rredcot", "sc_grpo"])
def test_multi_turn_tool_tokens_are_read_as_context_and_left_out_of_the_credit(hf_setup, method, tmp_path):
    """verl's multi-turn rollouts mark tool/environment tokens 0 in response_mask and 1 in attention_mask.
    The model read them while it wrote, so the probe scores them as context; response_mask is the loss mask,
    so they get no advantage and estimators normalise over the model's own tokens (credo's own trainer on
    the same rollouts with that loss mask gives the same credit)."""
    import dataclasses
    policy, task, r = hf_setup
    order = torch.arange(r.batch_size)
    multi = to_dataproto(r, task, order)
    tool = torch.zeros_like(multi.batch["response_mask"], dtype=torch.bool)
    long_rows = (r.completion_mask.sum(1) >= 6).nonzero().flatten()
    assert len(long_rows) >= 4
    tool[long_rows, 2:4] = True  # two tool tokens inside each long response
    multi.batch["response_mask"] = multi.batch["response_mask"] * (~tool).long()
    ours = apply_credit(multi, method, module=policy.model, tokenizer=policy.tokenizer, task=task,
                        seed=3).batch["advantages"]
    trained = r.completion_mask & ~tool
    expected = credo_trainer_credit(policy, task, dataclasses.replace(r, loss_mask=trained), method, tmp_path) * trained
    assert (ours[tool] == 0).all() and ours.abs().max() > 0
    assert (ours - expected).abs().max() <= 1e-6
    single = apply_credit(to_dataproto(r, task, order), method, module=policy.model, tokenizer=policy.tokenizer,
                          task=task, seed=3).batch["advantages"]
    if method == "rredcot":  # per-token values of the model's tokens: unchanged by their neighbours' training
        assert (ours - single * trained).abs().max() <= 1e-6
    else:  # SC-GRPO's weights average 1 over the trained tokens: each row's mean advantage there is GRPO's
        grpo = apply_credit(to_dataproto(r, task, order), "grpo", module=policy.model, tokenizer=policy.tokenizer,
                            task=task).batch["advantages"][:, 0]
        mixed = grpo != 0  # (an all-wrong group takes SC-GRPO's diversity route instead)
        mean = ours.sum(1) / trained.sum(1)
        assert (mixed & tool.any(1)).sum() >= 4 and (mean - grpo)[mixed].abs().max() <= 1e-5


def test_a_multi_turn_response_is_read_whole_past_a_turn_end(hf_setup):
    """A chat model ends each turn with its EOS (Qwen's <|im_end|>); verl's reward reads the whole response,
    so credo's text (verifier, SC-GRPO's references) must too, not stop at the first turn's end."""
    from credo.integrations.verl_credit import rollouts_from_batch
    policy, task, r = hf_setup
    row = next(i for i in range(r.batch_size) if bool(r.correct[i]) and int(r.completion_mask[i].sum()) >= 8)
    batch = to_dataproto(r, task, torch.arange(r.batch_size))
    batch.batch["responses"][row, 1] = policy.eos_id  # a turn ends after the first token, the answer comes later
    rollouts = rollouts_from_batch(batch, policy, task)
    assert "<answer>" in rollouts.completions[row] and bool(rollouts.correct[row])


def test_sampling_estimators_are_refused_on_rollouts_with_tool_outputs(hf_setup):
    """A continuation sampled from a multi-turn prefix would be the model's own text where a tool answered:
    estimators that sample (VinePPO, SPO-chain) are refused there; estimators that only score are not."""
    policy, task, r = hf_setup
    multi = to_dataproto(r, task, torch.arange(r.batch_size))
    tool = torch.zeros_like(multi.batch["response_mask"], dtype=torch.bool)
    tool[(r.completion_mask.sum(1) >= 6).nonzero().flatten(), 2:4] = True
    multi.batch["response_mask"] = multi.batch["response_mask"] * (~tool).long()
    with pytest.raises(ValueError, match="hold tool or environment outputs"):
        apply_credit(multi, "vineppo", module=policy.model, tokenizer=policy.tokenizer, task=task)
    single = apply_credit(to_dataproto(r, task, torch.arange(r.batch_size)), "vineppo", module=policy.model,
                          tokenizer=policy.tokenizer, task=task)
    assert single.batch["credo_cost"][0, 1] > 0  # without tool outputs it samples as before
