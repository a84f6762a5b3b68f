"""Any credo estimator on a verl `DataProto` shard: the worker-side credit step.

    batch = apply_credit(batch, "rredcot", module=hf_model, tokenizer=tok, task=make_task("gym:chain_sum"))

verl's layout (0.9.x), B rows of one data-parallel shard:
    prompts[B, P]            left-padded prompt ids        attention_mask[B, P + R]  1 on real tokens
    responses[B, R]          right-padded response ids     response_mask[B, R]       1 on trainable response tokens
                             (multi-turn: 0 on tool/environment tokens, which the attention mask keeps)
    token_level_scores[B, R] the verifier's score at the last response token (token_level_rewards: after a
                             KL-in-reward penalty; used when present, as verl's own estimators do)
    old_log_probs[B, R]      optional; uid (non-tensor): the prompt each row was sampled from
    credo_problem / extra_info["credo_problem"] (non-tensor): the credo Problem as JSON (see `dataset_row`),
                             else the gold answer from reward_model["ground_truth"] and the decoded prompt
    credo_group[B]           optional global group ids (the driver sets them so group-seeded choices do not
                             depend on the sharding); otherwise groups are the uids, in first-seen order
`apply_credit` builds credo `Rollouts` from these, runs the estimator through a Probe on `module` (a plain
Hugging Face causal LM: on FSDP workers an unsharded copy, see verl_worker.py), and writes
`advantages` and `returns` [B, R]: the estimator's per-token advantages with any token weights (SC-GRPO)
folded in (verl's clipped surrogate is linear in a non-negative weight) and zero outside a loss mask and
outside `response_mask`. The completion credo scores is every real response token (the attention mask), so
a multi-turn rollout's tool outputs stay in the context the probe reads, as they were when the model wrote.
Whole groups must be on the shard; batch-wide statistics cross shards through `gather` (shards.py).
A malformed batch (a missing field, a mask or reward tensor of the wrong width, a NaN reward, a token id outside
the vocabulary, credo_problem that is not JSON, no rows) is one UserError naming the field and the row
(verl_batch.py). The credit sanity checks (credo.integrations.checks; `checks=False` turns them off) run on the
estimator's credit before it is written: groups whole on their shard and one prompt each, finite advantages,
zero on padding and on tokens response_mask leaves out, the loss mask inside the real tokens, and for
grpo/dr_grpo/rloo group sums ~0. `leak_check=True` (`+credo.leak_check=true`) adds the masked-perturbation
invariance check (credo.integrations.leak_check) on the Rollouts built from the shard: padding of the response
ids, old log-probs and segment ids refilled with random values must leave every real token's credit unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import numpy as np
import torch

from credo import credit as credit_registry
from credo.integrations import checks as credit_checks
from credo.integrations.leak_check import check_estimator_invariance, folded
from credo.integrations.shards import group_ids, whole_group_order
from credo.integrations.verl_batch import check_batch, problem_from_row, reward_field, row_namer
from credo.core.protocols import Problem, SamplingConfig, rewards_for
from credo.core.config import UserError
from credo.core.probe import Probe, sampling_refusal
from credo.core.rollouts import Credit, Rollouts
from credo.core.segment import segmentation_stage
from credo.tasks import make_task
from credo.policy import bind_task
from credo.policy.hf import HFPolicy


def dataset_row(task: Any, problem: Problem, data_source: str = "credo") -> dict[str, Any]:
    """One verl RL-dataset row (parquet-ready) for a credo problem: chat prompt with the task's system
    prompt (as credo's HF backend formats it), gold answer for verl's reward, the Problem as JSON and the
    task's name and options (JSON) for `compute_score`."""
    system = getattr(task, "system_prompt", None)
    messages = ([{"role": "system", "content": system}] if system
                else []) + [{"role": "user", "content": problem.prompt}]
    encoded = json.dumps({"key": problem.key, "prompt": problem.prompt, "answer": problem.answer, "data": problem.data},
                         default=str)
    options = json.dumps(getattr(task, "options", {}) or {}, default=str)
    return {"data_source": data_source, "prompt": messages, "ability": "reasoning",
            "reward_model": {"style": "rule", "ground_truth": problem.answer},
            "extra_info": {"credo_problem": encoded, "credo_task": task.name, "credo_task_options": options}}


_TASKS: dict[tuple[str, str], Any] = {}


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **kwargs: Any) -> float:
    """verl's custom reward function (reward.custom_reward_function.path=<this file>): the credo task's
    verifier on a row made by `dataset_row`."""
    extra = extra_info or {}
    key = (extra["credo_task"], extra.get("credo_task_options", "{}"))
    if key not in _TASKS:
        _TASKS[key] = make_task(key[0], json.loads(key[1]))
    d = json.loads(extra["credo_problem"])
    problem = Problem(key=d["key"], prompt=d["prompt"], answer=str(d["answer"]), data=d.get("data") or {})
    return float(_TASKS[key].reward(problem, solution_str))


def problems_from_batch(batch: Any, tokenizer: Any) -> list[Problem]:
    """One credo Problem per row: from the row's credo_problem JSON, else gold answer + decoded prompt."""
    nt, B = batch.non_tensor_batch, len(batch)
    out = []
    for i in range(B):
        problem = problem_from_row(batch, i, row_namer(batch))
        if problem is not None:
            out.append(problem)
            continue
        reward_model = nt["reward_model"][i] if "reward_model" in nt else {}
        answer = str(reward_model.get("ground_truth", "")) if isinstance(reward_model, dict) else ""
        prompt_len = batch.batch["prompts"].shape[1]
        ids = batch.batch["prompts"][i][batch.batch["attention_mask"][i, :prompt_len].bool()]
        text = tokenizer.decode(ids.tolist(), skip_special_tokens=True)
        out.append(Problem(key=text, prompt=text, answer=answer))
    return out


def rollouts_from_batch(batch: Any, policy: Any, task: Any) -> Rollouts:
    """credo Rollouts[B] of a verl DataProto shard (see the module docstring for the fields read)."""
    t = batch.batch
    prompts, responses = t["prompts"], t["responses"]
    P = prompts.shape[1]
    prompt_mask = t["attention_mask"][:, :P].bool()
    # every real response token, tool outputs of a multi-turn rollout included: the model read them, so the
    # probe must too; response_mask, which drops them, is the loss mask (estimators normalise over it)
    completion_mask = t["attention_mask"][:, P:].bool()
    loss_mask = trainable_mask(batch) & completion_mask
    scores = t[reward_field(batch)]
    rewards = scores.sum(-1).float().cpu()
    if "credo_group" in t.keys():
        group = t["credo_group"].long().cpu()
    else:
        group = group_ids(np.asarray(batch.non_tensor_batch["uid"]).tolist())
    problems = problems_from_batch(batch, policy.tokenizer)
    # the whole response as verl's reward reads it: a chat model's turn-end token (its EOS) ends every turn
    texts = [policy.tokenizer.decode(row[m].tolist(), skip_special_tokens=True)
             for row, m in zip(responses.cpu(), completion_mask.cpu())]
    correct = rewards_for(task, problems, texts)[1] if task is not None else rewards >= 1.0
    old = t["old_log_probs"].float().cpu() if "old_log_probs" in t.keys() else torch.zeros(responses.shape)
    device = policy.device
    return Rollouts(prompt_ids=prompts.to(device), prompt_mask=prompt_mask.to(device),
                    completion_ids=responses.to(device),
                    completion_mask=completion_mask.to(device), group=group, rewards=rewards,
                    old_logprobs=(old * completion_mask.cpu()).to(device), correct=correct, problems=problems,
                    completions=texts, loss_mask=loss_mask.to(device))


def trainable_mask(batch: Any) -> torch.Tensor:
    """mask[B, R]: the response tokens verl trains on. In a multi-turn rollout, verl's `response_mask` drops
    the tool or environment tokens between the model's turns; they stay in the completion credo scores
    (attention_mask) and get no advantage. Single-turn: response_mask equals the response's attention mask."""
    t = batch.batch
    P = t["prompts"].shape[1]
    return (t["response_mask"] if "response_mask" in t.keys() else t["attention_mask"][:, P:]).bool()


def folded_advantages(result: Credit) -> torch.Tensor:
    """advantages[B, T] * weights (if any) * loss_mask (if any): what a weight-free PPO loss needs."""
    return folded(result)


def apply_credit(batch: Any, estimator: str, *, module: torch.nn.Module, tokenizer: Any, task: Any,
                 config: dict | None = None, gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 sampling: SamplingConfig | None = None, seed: int = 0, step: Any = None, checks: bool = True,
                 leak_check: bool = False) -> Any:
    """Write credo's `estimator` credit into `batch` (a verl DataProto shard) as `advantages`/`returns`.

    module: the actor's Hugging Face causal LM (scored without gradient). tokenizer: its tokenizer.
    task: the credo task (verifier, answer template, teacher context). config: the estimator's options.
    gather: Probe.gather across shards (None: this shard is the whole batch). sampling: what MC
    estimators sample with (default: up to the response length). seed: the Probe's generator.
    step: the trainer's step, for error messages. checks: run credo's credit sanity checks (every shard
    must call with the same value: the group check is a collective when `gather` is given). leak_check: also
    the masked-perturbation invariance check (credo.integrations.leak_check: the estimator runs twice).
    Returns the same DataProto with advantages/returns[B, R] (float32) and credo_cost[B, 2] (row 0 holds
    this shard's tokens scored/generated, so a concatenation of shards sums to the batch's cost).
    """
    spec = credit_registry.get(estimator)
    options = spec.make_config(config)
    device = next(module.parameters()).device
    check_batch(batch, vocab_size=module.get_input_embeddings().num_embeddings, step=step)
    policy = bind_task(HFPolicy(module, tokenizer, device=device, cast=False), task)
    rollouts = rollouts_from_batch(batch, policy, task)
    sizes = torch.unique(rollouts.group, return_counts=True)[1]
    if len(set(sizes.tolist())) > 1:  # a group cut by the shard boundary: its statistics would be wrong
        raise ValueError(f"apply_credit needs whole groups on the shard (equal sizes); got group sizes "
                         f"{sorted(set(sizes.tolist()))}: dispatch with credit_on_shards")
    located = credit_checks.Where(step="? (not given: apply_credit(step=...))" if step is None else step,
                                  off="apply_credit(checks=False) / +credo.checks=false", row_name=row_namer(batch))
    where = located if checks else None
    if where is not None:
        _check_groups(batch, rollouts, where, gather)
    sampling = sampling or SamplingConfig(max_new_tokens=int(rollouts.completion_ids.shape[1]))
    probe = Probe(policy, task, sampling, torch.Generator().manual_seed(seed), gather=gather,
                  no_sampling=sampling_refusal(rollouts))
    rollouts, cut = segmentation_stage(rollouts, probe, spec.reads_batch_segments(options))
    state = probe.generator.get_state()
    result = spec(rollouts, probe, options)
    result.cost = cut + result.cost  # credit's Probe work: segmenting, then the estimator
    target = batch.batch["responses"].device
    folded = folded_advantages(result).float()
    if leak_check:
        leak_where = dataclasses.replace(located, off="apply_credit(leak_check=False) / +credo.leak_check=false")
        check_estimator_invariance(spec, rollouts, probe, options, leak_where, before=folded, generator_state=state,
                                   vocab_size=module.get_input_embeddings().num_embeddings)
    if where is not None:
        _check_credit(batch, rollouts, folded, spec.name, where)
    advantages = folded * rollouts.trainable_mask().to(folded.device).float()  # response_mask within the completion
    cost = torch.zeros(len(batch), 2)
    cost[0] = torch.tensor([result.cost.tokens_scored, result.cost.tokens_generated], dtype=torch.float32)
    write_all(batch, {"advantages": advantages.to(target), "returns": advantages.clone().to(target),
                      "credo_cost": cost.to(target)}, step)
    return batch


def write_all(batch: Any, staged: dict[str, torch.Tensor], step: Any) -> None:
    """Write `staged` into batch.batch all together or not at all: advantages and returns must have the
    responses' shape (verl indexes them by it), and a write that fails part-way puts back what was there, so a
    batch is never left half-credited whatever went wrong."""
    shape = tuple(batch.batch["responses"].shape)
    for key in ("advantages", "returns"):
        if tuple(staged[key].shape) != shape:
            raise UserError(f"verl batch at step {step}: credo's {key} have shape {tuple(staged[key].shape)}, "
                            f"field 'responses' {shape}")
    before = {key: batch.batch[key] for key in staged if key in batch.batch.keys()}
    try:
        for key, value in staged.items():
            batch.batch[key] = value
    except BaseException:
        for key in staged:
            if key in before:
                batch.batch[key] = before[key]
            elif key in batch.batch.keys():
                del batch.batch[key]
        raise


def _check_groups(batch: Any, rollouts: Rollouts, where: Any, gather: Callable | None) -> None:
    """Each group's rows share one prompt; with `gather`, no group is on two shards (keys: the driver's global
    credo_group, else the uids, which verl makes per prompt)."""
    t = batch.batch
    prompts = torch.where(rollouts.prompt_mask, rollouts.prompt_ids, -1)
    keys = (t["credo_group"].cpu().double() if "credo_group" in t.keys()
            else credit_checks.string_keys(batch.non_tensor_batch["uid"]))
    credit_checks.check_groups(rollouts.group, prompts, where, gather=gather, global_keys=keys)


def _check_credit(batch: Any, rollouts: Rollouts, folded: torch.Tensor, estimator: str, where: Any) -> None:
    """The estimator's credit before the adapter masks it, against verl's masks: the response's real tokens
    (attention_mask) and the tokens verl's loss counts (response_mask)."""
    real = rollouts.completion_mask.cpu()
    trainable = trainable_mask(batch).cpu()
    credit = folded.detach().cpu()
    credit_checks.check_advantages(credit, real, trainable, where, credit_real=real,
                                   credit_trainable=rollouts.trainable_mask().cpu())
    if estimator in credit_checks.ZERO_SUM_ESTIMATORS:
        credit_checks.check_group_sums(credit, trainable, rollouts.group, where)


PREFIX = "credo:"


def credo_spec(config: Any) -> dict[str, Any] | None:
    """The credit spec from verl's config, or None when adv_estimator is not credo:<name>."""
    name = str(config.algorithm.adv_estimator)
    if not name.startswith(PREFIX):
        return None
    from omegaconf import OmegaConf
    node = config.get("credo")  # a top-level key: verl's AlgoConfig stays as verl defines it
    extra = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    if "task" not in extra:
        raise ValueError("algorithm.adv_estimator=credo:<name> needs +credo.task (e.g. gym:chain_sum)")
    spec = {"estimator": name[len(PREFIX):], "task": extra["task"], "task_options": extra.get("task_options", {}),
            "credit": extra.get("credit", {}), "seed": int(extra.get("seed", 0))}
    # credo's credit sanity checks, on unless +credo.checks=false; the leak check, off unless +credo.leak_check=true
    for key in ("checks", "leak_check"):
        if key in extra:
            if not isinstance(extra[key], bool):
                raise ValueError(f"credo.{key} must be true or false, got {extra[key]!r}")
            spec[key] = extra[key]
    return spec



def credit_on_shards(batch: Any, spec: dict[str, Any], call: Callable[[Any], Any], shards: int) -> Any:
    """The driver side: reorder `batch` so each of `shards` contiguous chunks holds whole groups, tag rows
    with global group ids (`credo_group`) and the credit spec (meta_info["credo"]), run `call` (the worker
    group's data-parallel credo_compute_advantage, or anything that maps a DataProto to one with
    `advantages`, `returns`, `credo_cost` in the same row order), and write the results back into `batch`
    in its own row order (verl's balance_batch order, which its mini-batching relies on, is kept).

    spec: {"estimator": name, "credit": options, "task": task name, "task_options": {...}, "seed": int}.
    """
    check_batch(batch, step=spec.get("step"))  # in the driver's row order, before the rows are dealt out
    group = group_ids(np.asarray(batch.non_tensor_batch["uid"]).tolist())
    order = whole_group_order(group, shards)
    keep = [k for k in ("prompts", "responses", "response_mask", "attention_mask", "token_level_scores",
                        "token_level_rewards", "old_log_probs") if k in batch.batch.keys()]
    rows = [k for k in ("uid", "credo_problem", "extra_info", "reward_model") if k in batch.non_tensor_batch]
    sub = batch.select(batch_keys=keep, non_tensor_batch_keys=rows, meta_info_keys=[])
    sub.reorder(order)
    sub.batch["credo_group"] = group[order].to(sub.batch["responses"].device)
    sub.batch["credo_row"] = order.to(sub.batch["responses"].device)  # errors name the driver's rows
    sub.meta_info["credo"] = dict(spec)
    out = call(sub)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    for key in ("advantages", "returns"):
        batch.batch[key] = out.batch[key][inverse].to(batch.batch["responses"].device)
    cost = out.batch["credo_cost"].sum(0)
    batch.meta_info["credo_tokens_scored"] = float(cost[0])
    batch.meta_info["credo_tokens_generated"] = float(cost[1])
    return batch
