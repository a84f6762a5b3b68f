"""verl equality numbers in one run: apply_credit vs verl's GRPO, vs credo's trainer, 2 shards vs 1.

    python bench/verl_equality.py

Uses the DataProto batch of tests/test_verl.py (a tiny random HF Llama, 16 rows, rows shuffled).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import pathlib
import tempfile
import torch
import test_verl as tv
from verl.trainer.ppo import core_algos
from credo.policy import bind_task
from credo.policy.hf import HFPolicy
from credo.tasks import make_task
tokenizer = tv.build_tokenizer()
model = tv.tiny_llama(tokenizer, init_range=tv.WIDE_INIT).eval()
task = make_task("gym:chain_sum", tv.TASK_OPTIONS)
policy = bind_task(HFPolicy(model, tokenizer, chat=True), task)
r = tv.rollouts(policy, task)
order = tv.shuffled(r.batch_size)
b = tv.apply_credit(tv.to_dataproto(r, task, order), "grpo", module=model, tokenizer=tokenizer, task=task)
exp, _ = core_algos.compute_grpo_outcome_advantage(b.batch["token_level_rewards"], b.batch["response_mask"],
                                                   b.non_tensor_batch["uid"])
print("grpo vs verl GRPO max|diff|", float((b.batch["advantages"]-exp).abs().max()))
tmp = pathlib.Path(tempfile.mkdtemp())
for m in ["rredcot", "sc_grpo"]:
    o = order if m == "rredcot" else torch.arange(r.batch_size)
    e = tv.credo_trainer_credit(policy, task, r, m, tmp)[o]
    # seed 3 = the trainer's probe seed at its first step (run seed + 3), which SC-GRPO's per-step reference draw uses
    b = tv.apply_credit(tv.to_dataproto(r, task, o), m, module=model, tokenizer=tokenizer, task=task, seed=3)
    print(m, "vs credo trainer max|diff|", float((b.batch["advantages"]-e).abs().max()), "max|A|", float(e.abs().max()))
for m in ["grpo", "rredcot", "sc_grpo"]:
    o = tv.shuffled(r.batch_size, seed=3)
    one = tv.credit_on_shards(tv.to_dataproto(r, task, o), {"estimator": m},
                              tv.dispatch(policy, task, 1), 1).batch["advantages"]
    two = tv.credit_on_shards(tv.to_dataproto(r, task, o), {"estimator": m},
                              tv.dispatch(policy, task, 2), 2).batch["advantages"]
    print(m, "2 shards vs 1 max|diff|", float((one-two).abs().max()))
