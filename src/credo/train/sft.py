"""SFT warm start for the tiny policy: worked solutions, plus two teacher-forced abilities.

The mixture (fractions configurable) holds
  - plain examples: prompt -> worked solution;
  - early-answer examples: prompt -> first k solution lines, the probe marker, the final answer
    (what RREDCoT's forced-answer probe and the `value` localiser read);
  - reference examples: a worked solution, the separator, then prompt -> solution (SC-GRPO's
    teacher context, exactly as `credit/sc_grpo.py` builds it: `task.reference_prompt`);
  - copy examples: the same context with a scrambled solution (random results) -> that scrambled text, which
    only reading the context predicts (credo.tasks.arith_skills.scrambled_solution);
  - localisation examples: the task's localisation request about a right or a corrupted trace ->
    `Step k`, its first wrong step by the task's step truth (SRPO's `prompt` localiser; see
    credo.tasks.arith_skills). A start with them has the request's letters in its alphabet.
Training stops at the first validation check whose greedy accuracy reaches `target_accuracy`
(a start that leaves room for RL), else keeps the best checkpoint seen. Results are cached by
config hash under $CREDO_CACHE/sft/<hash>. Each arithmetic task has its own SFT preset
(`sft_config_for`), so the default start of every command follows `--task`.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import sys
import time
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from credo.core.compressed import unpacked_copy
from credo.core.config import ConfigError, config_hash, dump_yaml
from credo.train.evaluate import evaluate
from credo.policy.base import right_pad
from credo.policy.tiny import TinyPolicy
from credo.policy.tokenizer import CharTokenizer
from credo.core.files import MetricsLog, atomic_directory, atomic_write_json, atomic_write_text, cache_root
from credo.tasks.arith import LOCALISATION_ALPHABET, ArithTask
from credo.tasks.arith_skills import localisation_example, scrambled_solution
from credo.core.protocols import Problem
from credo.train.sft_config import SFTConfig, sft_config_for


def make_tokenizer(config: SFTConfig | None = None) -> CharTokenizer:
    """The tiny policy's tokenizer: the task's alphabet, plus the localisation request's letters when `config`
    trains localisation (a start without them keeps the alphabet, and the weights' shape, it always had)."""
    localises = config is not None and config.localisation_frac > 0
    return CharTokenizer(ArithTask.alphabet + (LOCALISATION_ALPHABET if localises else ""),
                         ArithTask.banned_in_sampling)


def sft_example(task: ArithTask, problem: Problem, kind: str, rng: random.Random,
                localisation_right_frac: float = 0.2) -> tuple[str, str]:
    """(context text, target text) of one example of `kind` in {'plain', 'early', 'reference', 'copy',
    'localise'}."""
    if kind == "localise":
        return localisation_example(task, problem, rng, localisation_right_frac)
    if kind == "early":
        n_lines = rng.randint(0, len(task.solution_lines(problem)) - 1)
        return problem.prompt, task.early_answer_text(problem, n_lines)
    if kind == "reference":
        return task.reference_prompt(problem, task.solution(problem)), task.solution(problem)
    if kind == "copy":
        scrambled = scrambled_solution(problem, rng)
        return task.reference_prompt(problem, scrambled), scrambled
    return problem.prompt, task.solution(problem)


def make_batch(task: ArithTask, tokenizer: CharTokenizer, config: SFTConfig, generator: torch.Generator,
               rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (input_ids[B, L], targets[B, L], loss_mask[B, L]); targets are inputs shifted left."""
    problems = task.train_problems(config.batch_size, generator)
    rows, starts = [], []
    for problem in problems:
        context, target = sft_example(task, problem, example_kind(rng.random(), config), rng,
                                      config.localisation_right_frac)
        context_ids = tokenizer.encode(context, bos=True)
        rows.append(context_ids + tokenizer.encode(target, eos=True))
        starts.append(len(context_ids))
    ids, mask = right_pad(rows, tokenizer.pad_id)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    positions = torch.arange(targets.shape[1])[None]
    loss_mask = mask[:, 1:] & (positions >= torch.tensor(starts)[:, None] - 1)
    return inputs, targets, loss_mask


def example_kind(u: float, config: SFTConfig) -> str:
    """The kind of example a uniform draw `u` in [0, 1) picks, by the mixture's shares."""
    return draw_kind(u, (("early", config.early_answer_frac), ("reference", config.reference_frac),
                         ("localise", config.localisation_frac), ("copy", config.copy_frac)))


def draw_kind(u: float, shares: tuple[tuple[str, float], ...]) -> str:
    """The kind a uniform draw `u` in [0, 1) picks from (kind, share) pairs laid end to end; 'plain' past them."""
    edge = 0.0
    for kind, share in shares:
        edge += share
        if u < edge:
            return kind
    return "plain"


def lr_at(step: int, config: SFTConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


VALIDATION_SEED = 987_654  # validation problems come from the training split, never the held-out one


def validation_problems(task: ArithTask, n: int) -> list[Problem]:
    return task.train_problems(n, torch.Generator().manual_seed(VALIDATION_SEED))


def train_sft(config: SFTConfig, out_dir: str, progress: bool = True, snapshots: str = "") -> dict:
    """Train from scratch into `out_dir` (atomically); returns a summary dict. With `snapshots`, the policy of
    every validation check is also saved there as step-N (atomically; they do not change the start)."""
    torch.manual_seed(config.seed)
    task = ArithTask(config.task)
    tokenizer = make_tokenizer(config)
    policy = TinyPolicy.create(replace(config.model, vocab_size=tokenizer.vocab_size), tokenizer, seed=config.seed)
    if config.init:
        initialise_from(policy, ensure_sft(sft_config_for(config.init), progress=progress))
    model = policy.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(config.beta1, config.beta2),
                                  weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    rng = random.Random(config.seed)
    val = validation_problems(task, config.eval_n)
    best = (-1.0, -1, None)  # (accuracy, step, state_dict)
    history = []
    start = time.time()
    if snapshots:
        os.makedirs(snapshots, exist_ok=True)
    bar = tqdm(range(config.max_steps), desc="sft", disable=not progress, dynamic_ncols=True)
    for step in bar:
        loss = sft_step(model, optimizer, make_batch(task, tokenizer, config, generator, rng), lr_at(step, config),
                        config.grad_clip)
        if (step + 1) % config.eval_every == 0 or step + 1 == config.max_steps:
            model.eval()
            acc = evaluate(policy, task, val).accuracy
            history.append({"step": step + 1, "loss": float(loss.detach()), "val_accuracy": acc,
                            "seconds": time.time() - start})
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", val_acc=f"{acc:.3f}")
            if snapshots:
                policy.save(os.path.join(snapshots, f"step-{step + 1}"))
            if acc > best[0]:
                best = (acc, step + 1, {k: v.clone() for k, v in model.state_dict().items()})
            if acc >= config.target_accuracy:
                break
    bar.close()
    if config.keep == "last":
        best = (history[-1]["val_accuracy"], history[-1]["step"], None)
    else:
        model.load_state_dict(best[2])
    summary = {"val_accuracy": best[0], "step": best[1], "seconds": time.time() - start,
               "config_hash": config_hash(config)}
    write_start(out_dir, policy, config, summary, history)
    return summary


def sft_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], lr: float, grad_clip: float) -> torch.Tensor:
    """One AdamW step at `lr` on `batch` = (inputs[B, L], targets[B, L], loss_mask[B, L]): the cross-entropy of
    the masked targets, averaged over them; returns that loss."""
    inputs, targets, loss_mask = batch
    model.train()
    for group in optimizer.param_groups:
        group["lr"] = lr
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    loss = (loss * loss_mask.reshape(-1)).sum() / loss_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss


def write_start(out_dir: str, policy: Any, config: Any, summary: dict, history: list[dict]) -> None:
    """An SFT start in `out_dir`, atomically: the policy, its config (an SFTConfig or a credo.train.sft_hf
    HFSFTConfig), its summary and its validation history."""
    with atomic_directory(out_dir) as tmp:
        policy.save_into(tmp)
        atomic_write_text(os.path.join(tmp, "sft_config.yaml"), dump_yaml(config))
        atomic_write_json(os.path.join(tmp, "sft_summary.json"), summary)
        log = MetricsLog(os.path.join(tmp, "metrics.jsonl"))
        for row in history:
            log.append(row)


def initialise_from(policy: TinyPolicy, directory: str) -> None:
    """Copy the weights of the tiny start in `directory` into `policy` (sft.init). Its alphabet must be a prefix
    of the policy's (so every character keeps its id); the rows of characters it lacks keep their fresh init."""
    source = TinyPolicy.load(directory)
    mine, theirs = policy.model.config, source.model.config
    shape = ("n_layer", "d_model", "n_head", "max_len")
    if any(getattr(mine, f) != getattr(theirs, f) for f in shape) or \
            not policy.tokenizer.alphabet.startswith(source.tokenizer.alphabet):
        raise ConfigError(f"sft.init: the start in {directory} "
                          f"({', '.join(f'{f}={getattr(theirs, f)}' for f in shape)}, alphabet "
                          f"{source.tokenizer.alphabet!r}) does not fit sft.model "
                          f"({', '.join(f'{f}={getattr(mine, f)}' for f in shape)}, alphabet "
                          f"{policy.tokenizer.alphabet!r})")
    state = policy.model.state_dict()
    for name, value in source.model.state_dict().items():
        rows = value.shape[0]
        state[name][:rows] = value  # the embedding's extra rows (new characters) keep their init
    policy.model.load_state_dict(state)


def packaged_start(config: SFTConfig) -> str | None:
    """The folder of the start shipped with the package for this exact config, if any: the starts a preset uses
    (arith, arith-long-first, arith-long-skilled-band), their weights xz-compressed (credo.core.compressed)."""
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", f"sft-{config_hash(config)}")
    return path if os.path.isfile(os.path.join(path, "policy.json")) else None


def ensure_sft(config: SFTConfig | None = None, force: bool = False, progress: bool = True, task: str = "arith") -> str:
    """Path of the SFT start for `config` (default: `task`'s preset) in the cache: there already, else unpacked
    from the packaged copy, else trained now from its recipe (a start no preset uses, e.g. arith-long-skilled:
    75 min on one CPU core). A rebuild follows the recipe but need not reproduce the bytes of a copy built earlier:
    the shipped arith start logged a step-100 loss of 1.5145, its rebuild on 2026-12-06 1.5440."""
    config = config or sft_config_for(task)
    path = os.path.join(cache_root(), "sft", config_hash(config))
    if not force and os.path.isfile(os.path.join(path, "policy.json")):
        return path
    shipped = packaged_start(config)
    if shipped and not force:
        unpacked_copy(shipped, path)
        return path
    if progress:
        print(f"credo: training the SFT start {config_hash(config)} from its recipe into {path} (not shipped; "
              "cached once built)", file=sys.stderr, flush=True)
    train_sft(config, path, progress=progress)
    return path


def copy_checkpoint(source: str, destination: str) -> None:
    with atomic_directory(destination) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
