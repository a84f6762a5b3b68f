"""A short format-and-answer SFT of a Hugging Face model on a task's own worked solutions.

A chat model that never writes the task's answer format (SmolLM2-135M scores 0 on `gym:chain_sum`: it never
writes `<answer>` tags) gives GRPO nothing to learn from: every reward in every group is 0. This stage
teaches the format on the task's worked solutions (`task.worked_solution`; for reasoning-gym's chain sums the
left-to-right running sum) followed by the task's own answer marker (`task.answer_probe`), and stops at the
first validation check at or above `target_accuracy`, so the start leaves room for RL.

Two more kinds of example, off by default, teach what the seed methods assume a policy can do (as
credo.train.sft does for the tiny policy; docs/methods.md, "## Premise checks"):
  - reference (`reference_frac`): SC-GRPO's teacher context, exactly as `credit/sc_grpo.py` builds it
    (`task.reference_prompt` with the worked solution and answer as tau, system prompt included) -> that text;
  - localise (`localisation_frac`): SRPO's localisation request as the `prompt` localiser sends it (a bare user
    turn) about a worked solution with one corrupted line -> `\\boxed{k}` (credo.tasks.gym_skills; needs a
    task with step labels, `task_options.step_labels=true`).

Prompts are rendered exactly as training renders them (the chat template with the task's system prompt);
the loss is the mean cross-entropy over completion tokens (the solution, the answer, the end-of-turn token).
Optimiser: AdamW, linear warm-up then constant. Validation problems come from the training split with a
fixed seed (the held-out set is never used to choose the checkpoint); the best checkpoint seen is kept
(the later one on a tie).
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from credo.core.config import (MAX_HELD_OUT, MAX_NEW_TOKENS, MAX_STEP_COMPLETIONS, ConfigError, check,
                               check_in)
from credo.core.rollouts import Prompt
from credo.policy.adapters import LoraSettings, is_lora
from credo.core.protocols import left_pad
from credo.policy.device import autocast_dtype, check_device_fields, resolve_device, resolve_dtype
from credo.train.evaluate import evaluate
from credo.tasks.gym_skills import REPLIES, localisation_example
from credo.train.sft import VALIDATION_SEED, draw_kind, write_start
from credo.train.sft_resume import (SAVE_EVERY_SECONDS, Progress, discard, load_progress, save_progress,
                                    trained_weights)
from credo.policy.smollm import ALIASES
from credo.tasks import make_task
from credo.policy.hf_folder import refuse_custom_code
from credo.policy import bind_task, load_policy
from credo.policy.hf import HFPolicy


@dataclass(frozen=True)
class HFSFTConfig:
    """Supervised format/answer warm start of a Hugging Face model (`credo sft --start ...`)."""

    start: str = "smollm2-135m"
    """The model: a Hugging Face model directory or 'smollm2-135m'."""
    task: str = "gym:chain_sum"
    """A task whose problems carry worked solutions: 'gym:<dataset>' or 'jsonl:<path>' with a `solution` field."""
    task_options: dict = field(default_factory=dict)
    """The task's own options (e.g. min_terms, max_digits for gym:chain_sum)."""
    steps: int = 30
    """Optimiser steps at most."""
    batch_size: int = 8
    """Examples per step."""
    lr: float = 5e-5
    """AdamW learning rate after warm-up."""
    warmup_steps: int = 5
    """Steps of linear warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"omit_default": True})
    """LoRA adapters instead of every weight (lora.r > 0): the saved start is then the adapter alone, its base
    named and checked on load (credo.policy.adapters). Left out of sft_config.yaml while off."""
    eval_every: int = 3
    """Steps between validation checks (format is learnt within a few steps: check often to stop early)."""
    eval_n: int = 50
    """Validation problems per check (training split, fixed seed)."""
    max_new_tokens: int = 64
    """Generation limit of the validation checks."""
    target_accuracy: float = 0.3
    """Stop at the first check at or above it (1.0 = train all `steps`); leaves room for RL."""
    keep: str = field(default="best", metadata={"omit_default": True})
    """Which weights are saved: 'best' (the best validation check, the later on a tie) or 'last' (the final
    step's: a stage that teaches skills the accuracy check does not measure, from a start that has the format)."""
    reference_frac: float = field(default=0.0, metadata={"omit_default": True})
    """Share of solution-in-context examples (SC-GRPO's teacher context with the worked solution -> that solution)."""
    localisation_frac: float = field(default=0.0, metadata={"omit_default": True})
    """Share of localisation examples (SRPO's request about a trace with one wrong line -> \\boxed{its step})."""
    localisation_reply: str = field(default="boxed", metadata={"omit_default": True})
    """The localisation examples' target: 'boxed' (\\boxed{k} alone) or 'checks' (each step re-checked up to the
    first wrong one, a line each, then \\boxed{k}: naming the step copies a verdict; credo.tasks.gym_skills)."""
    loss_mean: str = field(default="token", metadata={"omit_default": True})
    """'token': the mean over every target token of the batch (a long worked solution outweighs a short reply);
    'example': each example's mean over its own target tokens, then the mean over the batch (a localisation
    reply counts as much as a solution)."""
    device: str = "auto"
    """Where the model runs: auto (CUDA when torch finds a GPU, else the CPU), cpu, cuda or cuda:N (docs/gpu.md)."""
    dtype: str = "float32"
    """float32; bfloat16 (a Hugging Face model's weights, on a GPU); or bfloat16-mixed (float32 weights, matrix
    products in bfloat16 under torch.autocast: a Hugging Face model, on a CPU with AMX/AVX512-BF16 or a GPU)."""
    seed: int = 0
    """Seed of the examples."""

    def __post_init__(self) -> None:
        check_device_fields(self.device, self.dtype, "sft.")
        for name in ("steps", "batch_size", "eval_every", "eval_n", "max_new_tokens"):
            check(getattr(self, name) > 0, f"sft.{name} must be > 0, got {getattr(self, name)}")
        check_in(self.eval_n, 1, MAX_HELD_OUT, "sft.eval_n")
        check_in(self.batch_size, 1, MAX_STEP_COMPLETIONS, "sft.batch_size")
        check_in(self.max_new_tokens, 1, MAX_NEW_TOKENS, "sft.max_new_tokens")
        check(self.lr > 0, f"sft.lr must be > 0, got {self.lr}")
        check(self.warmup_steps >= 0, f"sft.warmup_steps must be >= 0, got {self.warmup_steps}")
        check(self.weight_decay >= 0, f"sft.weight_decay must be >= 0, got {self.weight_decay}")
        check(self.grad_clip > 0, f"sft.grad_clip must be > 0, got {self.grad_clip}")
        check(0 < self.target_accuracy <= 1, f"sft.target_accuracy must be in (0, 1], got {self.target_accuracy}")
        check(self.keep in ("best", "last"), f"sft.keep must be 'best' or 'last', got {self.keep!r}")
        check(0 <= self.reference_frac < 1 and 0 <= self.localisation_frac < 1
              and self.reference_frac + self.localisation_frac < 1,
              "sft.reference_frac and sft.localisation_frac must be in [0, 1) and leave room for plain examples "
              f"(their sum < 1), got {self.reference_frac} and {self.localisation_frac}")
        check(self.localisation_reply in REPLIES,
              f"sft.localisation_reply must be one of {', '.join(REPLIES)}, got {self.localisation_reply!r}")
        check(self.loss_mean in ("token", "example"),
              f"sft.loss_mean must be 'token' or 'example', got {self.loss_mean!r}")


def sft_example(task, problem) -> str:  # noqa: ANN001
    """The target completion: the worked solution, then the task's answer marker and answer."""
    solution = task.worked_solution(problem)
    if solution is None:
        raise ConfigError(f"task {task.name}: problem {problem.prompt[:60]!r} has no worked solution; SFT needs "
                          "the task's own solutions (reasoning-gym datasets with a solution/cot or a +/- "
                          "expression, or jsonl rows with a `solution` field)")
    marker, answer = task.answer_probe(problem.answer)
    return solution.rstrip() + marker + answer


def example_kind(u: float, config: HFSFTConfig) -> str:
    """The kind of example a uniform draw `u` in [0, 1) picks, by the mixture's shares."""
    return draw_kind(u, (("reference", config.reference_frac), ("localise", config.localisation_frac)))


def mixture_example(task, problem, kind: str, rng: random.Random,  # noqa: ANN001
                    reply: str = "boxed") -> tuple[str | Prompt, bool, str]:
    """(prompt, whether the task's system prompt goes with it, target text) of one example of `kind` in
    {'plain', 'reference', 'localise'} (module docstring); `reply`: the localisation target's form."""
    if kind == "localise":
        request, target = localisation_example(task, problem, rng, reply)
        return request, False, target  # a bare user turn, as credo.strategies.localisers sends it
    target = sft_example(task, problem)
    return (task.reference_prompt(problem, target) if kind == "reference" else problem.prompt), True, target


def make_batch(policy, task, problems, kinds: list[str] | None = None,  # noqa: ANN001
               rng: random.Random | None = None,
               reply: str = "boxed") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt ids, prompt mask) left-padded (B, P) and (target ids, target mask) right-padded (B, C): the
    target text (worked solution and answer, or a localisation reply) and the end-of-turn token, the only
    tokens the loss reads. `kinds` (default: all 'plain') picks each problem's kind of example."""
    rng = rng or random.Random(0)
    examples = [mixture_example(task, p, k, rng, reply) for p, k in zip(problems, kinds or ["plain"] * len(problems))]
    prompt_ids, prompt_mask = left_pad([policy.prompt_row(p, system) for p, system, _ in examples], policy.pad_id,
                                       policy.device)
    target_ids, target_mask = policy.encode_completions([t for _, _, t in examples], eos=True)
    return prompt_ids, prompt_mask, target_ids, target_mask


def sft_loss(policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, target_ids: torch.Tensor,  # noqa: ANN001
             target_mask: torch.Tensor, mean: str = "token") -> torch.Tensor:
    """Next-token cross-entropy over the target tokens (target_ids, target_mask: (B, C); the LM head runs over
    those positions only): the mean over every target token of the batch (mean='token'), or each row's mean
    over its own target tokens, then the mean over rows (mean='example')."""
    logits = policy.completion_logits(prompt_ids, prompt_mask, target_ids, target_mask)  # (B, C, V)
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_ids.reshape(-1),
                                               reduction="none").view_as(target_ids)
    weights = target_mask.float()
    if mean == "example":
        return ((losses * weights).sum(1) / weights.sum(1).clamp(min=1)).mean()
    return (losses * weights).sum() / weights.sum().clamp(min=1)


def check_sft_inputs(config: HFSFTConfig):  # noqa: ANN201
    """The task, after checking that it builds, that its problems carry worked solutions and that the start
    exists (a user error is one line, raised before any output directory is touched)."""
    task = make_task(config.task, config.task_options, prefix="sft.task_options.")
    resolve_dtype(config.dtype, resolve_device(config.device, "sft.device"), "sft.dtype")
    sft_example(task, task.train_problems(1, torch.Generator().manual_seed(config.seed))[0])
    if config.localisation_frac > 0 and not getattr(task, "has_step_labels", False):
        raise ConfigError(f"sft.localisation_frac={config.localisation_frac} needs a task with step labels (the "
                          "targets are its first wrong steps): set sft.task_options.step_labels=true on a +/- chain")
    if config.start not in ALIASES and not os.path.isfile(os.path.join(config.start, "config.json")):
        raise ConfigError(f"sft.start={config.start!r} is neither 'smollm2-135m' nor a Hugging Face model directory "
                          "(no config.json)")
    if config.start not in ALIASES:
        refuse_custom_code(config.start, "sft.start")
    return task


def train_hf_sft(config: HFSFTConfig, out_dir: str, progress: bool = True, task=None,  # noqa: ANN001
                 snapshots: str = "", resume: bool = True) -> dict:
    """Fine-tune `config.start` on `config.task`'s worked solutions into `out_dir` (atomically); -> summary.
    `task`: the task `check_sft_inputs(config)` returned, if the caller checked already. With `snapshots`, the
    policy of every validation check is also a start of its own in snapshots/step-N (a LoRA one: its adapter
    alone), so that a skill the accuracy check does not measure can be traced along the training. Every check
    may leave the SFT's state in out_dir/resume (credo.train.sft_resume), from which the same call goes on
    (`resume` False: that state is discarded and it trains from the start)."""
    task = task or check_sft_inputs(config)
    policy = sft_policy(config, task)
    torch.manual_seed(config.seed)
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    generator, rng = torch.Generator().manual_seed(config.seed), random.Random(config.seed)
    validation = task.train_problems(config.eval_n, torch.Generator().manual_seed(VALIDATION_SEED))

    def check_now() -> float:
        policy.model.eval()  # no dropout while generating (and no draw from the global RNG)
        return evaluate(policy, task, validation, max_new_tokens=config.max_new_tokens, batch_size=64).accuracy

    if not resume:
        discard(out_dir)
    done = load_progress(out_dir, config, policy, optimizer, generator, rng)
    if done is None:
        history = [{"step": 0, "val_accuracy": check_now(), "seconds": 0.0}]
        done = Progress(0, history, (history[0]["val_accuracy"], 0, trained_weights(policy)), 0.0)
    history, best, start, saved = done.history, done.best, time.time() - done.seconds, None
    bar = tqdm(range(done.step, config.steps), desc="sft", disable=not progress, dynamic_ncols=True,
               initial=done.step, total=config.steps)
    for step in bar:
        if best[0] >= config.target_accuracy:
            break
        loss = sft_step(policy, task, config, optimizer, trainable, generator, rng, step)
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            accuracy = check_now()
            history.append({"step": step + 1, "loss": round(loss, 6), "val_accuracy": accuracy,
                            "seconds": round(time.time() - start, 1)})
            bar.set_postfix(loss=f"{loss:.3f}", val_acc=f"{accuracy:.3f}")
            # a tie goes to the more trained weights (a tiny model scores 0 throughout)
            if accuracy >= best[0] or config.keep == "last":
                best = (accuracy, step + 1, trained_weights(policy))
            if snapshots:
                write_start(os.path.join(snapshots, f"step-{step + 1}"), policy, config,
                            {"val_accuracy": accuracy, "step": step + 1, "seconds": history[-1]["seconds"],
                             "val_n": len(validation), "start": config.start, "task": config.task}, history)
            if saved is None or time.time() - saved >= SAVE_EVERY_SECONDS:
                save_progress(out_dir, config, policy, optimizer, generator, rng,
                              Progress(step + 1, history, best, time.time() - start))
                saved = time.time()
    bar.close()
    policy.model.load_state_dict(best[2], strict=not is_lora(policy.model))  # a LoRA policy's: its adapters
    summary = {"val_accuracy": best[0], "step": best[1], "seconds": round(time.time() - start, 1),
               "val_n": len(validation), "start": config.start, "task": config.task}
    write_start(out_dir, policy, config, summary, history)
    return summary


def sft_step(policy: HFPolicy, task: Any, config: HFSFTConfig, optimizer: torch.optim.Optimizer,
             trainable: list[torch.Tensor], generator: torch.Generator, rng: random.Random, step: int) -> float:
    """One optimiser step (0-based `step`, for the warm-up) on a batch drawn from the two streams; -> its loss."""
    policy.model.train()
    for group in optimizer.param_groups:
        group["lr"] = config.lr * min(1.0, (step + 1) / (config.warmup_steps + 1))
    problems = task.train_problems(config.batch_size, generator)
    kinds = [example_kind(rng.random(), config) for _ in problems]
    loss = sft_loss(policy, *make_batch(policy, task, problems, kinds, rng, config.localisation_reply),
                    mean=config.loss_mean)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip)
    optimizer.step()
    return float(loss.detach())


def sft_policy(config: HFSFTConfig, task: Any) -> HFPolicy:
    """config.start loaded on its device and dtype (with its LoRA adapters, when config.lora asks), bound to `task`;
    a tiny credo policy is refused (`credo sft --task arith` builds those)."""
    device = resolve_device(config.device, "sft.device")
    policy = bind_task(load_policy(config.start, device=device, lora=config.lora, seed=config.seed,
                                   dtype=resolve_dtype(config.dtype, device, "sft.dtype"),
                                   autocast=autocast_dtype(config.dtype)), task)
    if not isinstance(policy, HFPolicy):
        raise ConfigError(f"sft.start={config.start!r} is a tiny credo policy; "
                          "`credo sft --task arith...` builds those")
    return policy
