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
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

from credo.core.compressed import unpacked_copy
from credo.core.config import MAX_HELD_OUT, MAX_STEP_COMPLETIONS, ConfigError, check, check_in, config_hash, dump_yaml
from credo.train.evaluate import evaluate
from credo.policy.base import right_pad
from credo.policy.gpt import GPTConfig
from credo.policy.tiny import TinyPolicy
from credo.policy.tokenizer import CharTokenizer
from credo.core.files import MetricsLog, atomic_directory, atomic_write_json, atomic_write_text, cache_root
from credo.tasks.arith import PRESETS as TASK_PRESETS
from credo.tasks.arith import LOCALISATION_ALPHABET, ArithConfig, ArithTask
from credo.tasks.arith_skills import localisation_example, scrambled_solution
from credo.core.protocols import Problem


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start of the tiny policy on the `arith` task. Optimiser: AdamW, linear warm-up then
    cosine decay to 10% over max_steps, gradient clipping. Loss on completion tokens only."""

    task: ArithConfig = field(default_factory=ArithConfig)
    """The arithmetic task the examples come from."""
    model: GPTConfig = field(default_factory=GPTConfig)
    """The tiny GPT's shape."""
    max_steps: int = 1600
    """Optimiser steps at most."""
    batch_size: int = 64
    """Examples per step."""
    lr: float = 2e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 100
    """Steps of linear warm-up."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.98
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    early_answer_frac: float = 0.15
    """Share of early-answer examples (first k solution lines, the probe marker, the final answer)."""
    reference_frac: float = 0.1
    """Share of reference examples (a worked solution, the separator, then prompt -> solution: SC-GRPO's
    teacher context)."""
    copy_frac: float = field(default=0.0, metadata={"omit_default": True})
    """Share of copy examples (a scrambled solution with random results in the teacher's context -> that text):
    only copying predicts them, so they teach the model to read a solution in its context."""
    localisation_frac: float = field(default=0.0, metadata={"omit_default": True})
    """Share of localisation examples (the task's localisation request about a trace -> `Step k`, its first
    wrong step); > 0 adds the request's letters to the tokenizer's alphabet."""
    localisation_right_frac: float = field(default=0.2, metadata={"omit_default": True})
    """Share of the localisation examples whose trace is right (target `Step 0`); the others are corrupted
    at a uniform line."""
    init: str = field(default="", metadata={"omit_default": True})
    """'' = random initial weights; an SFT preset's name (e.g. arith) = start from that preset's start, whose
    model must have the same shape (its alphabet may be shorter: new characters get fresh embeddings)."""
    eval_every: int = 100
    """Steps between validation checks (validation problems come from the training split with a fixed
    seed, so held-out numbers stay untouched by checkpoint selection)."""
    eval_n: int = 200
    """Validation problems per check."""
    target_accuracy: float = 0.4
    """Stop once validation greedy accuracy reaches it (1.0 = train to max_steps)."""
    keep: str = field(default="best", metadata={"omit_default": True})
    """Which weights the start keeps: 'best' = those of the validation check with the highest greedy accuracy;
    'last' = those of the last step (for a mixture whose other skills keep growing after plain accuracy has
    peaked)."""
    seed: int = 0
    """Seed of the examples and the initial weights."""

    def __post_init__(self) -> None:
        check(self.max_steps > 0, f"sft.max_steps must be > 0, got {self.max_steps}")
        check(self.batch_size > 0, f"sft.batch_size must be > 0, got {self.batch_size}")
        check_in(self.batch_size, 1, MAX_STEP_COMPLETIONS, "sft.batch_size")
        check(self.lr > 0, f"sft.lr must be > 0, got {self.lr}")
        check(0 <= self.early_answer_frac and 0 <= self.reference_frac
              and self.early_answer_frac + self.reference_frac < 1,
              f"sft.early_answer_frac + sft.reference_frac must be in [0, 1), got {self.early_answer_frac} + "
              f"{self.reference_frac}")
        check(0 <= self.localisation_frac < 1 and 0 <= self.copy_frac < 1
              and self.early_answer_frac + self.reference_frac + self.localisation_frac + self.copy_frac < 1,
              "sft.localisation_frac and sft.copy_frac must be in [0, 1) and leave room for plain examples "
              "(early_answer_frac + reference_frac + localisation_frac + copy_frac < 1), got "
              f"{self.localisation_frac} and {self.copy_frac}")
        check(0 <= self.localisation_right_frac <= 1,
              f"sft.localisation_right_frac must be in [0, 1], got {self.localisation_right_frac}")
        check(0 < self.target_accuracy <= 1, f"sft.target_accuracy must be in (0, 1], got {self.target_accuracy}")
        check(self.eval_every > 0 and self.eval_n > 0, "sft.eval_every and sft.eval_n must be > 0")
        check_in(self.eval_n, 1, MAX_HELD_OUT, "sft.eval_n")
        check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
              f"sft.beta1/beta2 must be in [0, 1), got {self.beta1}/{self.beta2}")
        check(self.weight_decay >= 0, f"sft.weight_decay must be >= 0, got {self.weight_decay}")
        check(self.grad_clip > 0, f"sft.grad_clip must be > 0, got {self.grad_clip}")
        check(self.init == "" or self.init in SFT_PRESETS, f"sft.init must be '' or an SFT preset "
              f"({', '.join(SFT_PRESETS)}), got {self.init!r}")
        check(self.keep in ("best", "last"), f"sft.keep must be 'best' or 'last', got {self.keep!r}")
        check(self.warmup_steps >= 0, f"sft.warmup_steps must be >= 0, got {self.warmup_steps}")


# Named SFT presets: the SFTConfig fields that differ from the defaults. arith-long-first: 1-digit 8-12 term
# chains on a 4x wider GPT (d_model 256, 8 heads, 3.2M parameters), validated every 25 steps and stopped at the
# first greedy accuracy >= 0.35. Measured (docs/results/arith-long-calibration): on the default 0.83M GPT the
# start landed in the accuracy band but GRPO could not improve it at any learning rate; from the wider start GRPO
# gains ~20 points in 400k tokens. SFT cost: 500 steps, 23 min on 2 shared cores (~4x the small model's step).
# Its teacher cannot read its verified solution and it cannot answer a localisation request
# (docs/results/arith-long-skilled). arith-long-skilled-1 and -2: a first try at a start with those abilities, on
# the default 0.83M GPT from the `arith` start, 30% solution-in-context and 20% localisation examples, two stages
# of at most 400 steps at batch 32 (held-out greedy 0.067, then 0.240): neither's teacher read its solution
# (-15 to -17 nats) nor did it localise above chance. arith-long-skilled (the skilled start; no preset uses it, so it
# is not shipped and `sft:arith-long-skilled` trains it from this recipe, 75 min on one CPU core): the
# arith-long-first start fine-tuned 1600 steps at batch 32, lr 5e-4, on 50% solution-in-context, 20% localisation,
# 10% early-answer and 20% plain examples, keeping the last step: its teacher reads its own verified solutions
# (gain > 0 from step ~1000; the largest-KL token lands in the first wrong step ~5x as often as a uniform token);
# its localisation stays at chance, and its greedy accuracy (~0.85) is above the 0.25-0.45 band of the earlier
# starts. 75 min on one core of the shared machine (docs/results/arith-long-skilled). GRPO does not improve it
# (0.830 -> 0.825 in 400k tokens). arith-long-skilled-band (shipped): the same start with 70% solution-in-context,
# 20% localisation, 5% early-answer and 5% plain examples for 800 steps: its teacher reads its solutions too
# (+1.0 nats on the validation split at step 800) at greedy 0.60 held out, leaving room for RL. 18 min on 2 cores.
SFT_PRESETS: dict[str, dict] = {
    "arith": {},
    "arith-long-first": {"max_steps": 1200, "eval_every": 25, "target_accuracy": 0.35,
                         "model": GPTConfig(d_model=256, n_head=8)},
    "arith-long-skilled-1": {"max_steps": 400, "batch_size": 32, "warmup_steps": 30, "eval_every": 25, "eval_n": 100,
                             "target_accuracy": 0.35, "init": "arith", "lr": 1e-3,
                             "early_answer_frac": 0.1, "reference_frac": 0.3, "localisation_frac": 0.2},
    "arith-long-skilled-2": {"max_steps": 400, "batch_size": 32, "warmup_steps": 10, "eval_every": 25, "eval_n": 100,
                             "target_accuracy": 0.35, "init": "arith-long-skilled-1", "lr": 5e-4,
                             "early_answer_frac": 0.1, "reference_frac": 0.3, "localisation_frac": 0.2},
    "arith-long-skilled": {"max_steps": 1600, "batch_size": 32, "warmup_steps": 50, "eval_every": 200,
                           "eval_n": 100, "target_accuracy": 1.0, "keep": "last", "init": "arith-long-first",
                           "lr": 5e-4, "model": GPTConfig(d_model=256, n_head=8), "early_answer_frac": 0.1,
                           "reference_frac": 0.5, "localisation_frac": 0.2},
    "arith-long-skilled-band": {"max_steps": 800, "batch_size": 32, "warmup_steps": 50, "eval_every": 200,
                                "eval_n": 100, "target_accuracy": 1.0, "keep": "last", "init": "arith-long-first",
                                "lr": 5e-4, "model": GPTConfig(d_model=256, n_head=8), "early_answer_frac": 0.05,
                                "reference_frac": 0.7, "localisation_frac": 0.2},
}
PRESET_TASKS: dict[str, str] = {"arith": "arith", "arith-long-first": "arith-long",
                                "arith-long-skilled-1": "arith-long", "arith-long-skilled-2": "arith-long",
                                "arith-long-skilled": "arith-long", "arith-long-skilled-band": "arith-long"}
"""The task whose problems each SFT preset trains on."""
DEFAULT_PRESETS: dict[str, str] = {"arith": "arith", "arith-long": "arith-long-first"}
"""Each arithmetic task's default start (its SFT preset); the others are selected by name ('sft:<preset>')."""


def preset_names() -> list[str]:
    """Names `credo sft --task`/`sft:<name>` accept: the tasks (their default start) and every named preset."""
    return list(DEFAULT_PRESETS) + [name for name in SFT_PRESETS if name not in DEFAULT_PRESETS]


def sft_config_for(task: str = "arith") -> SFTConfig:
    """The SFT preset named `task`: a task's default start, or a preset by name (tasks without a preset of
    their own start from the `arith` policy)."""
    name = DEFAULT_PRESETS.get(task, task)
    name = name if name in SFT_PRESETS else "arith"
    return replace(SFTConfig(task=TASK_PRESETS[PRESET_TASKS[name]]), **SFT_PRESETS[name])


def check_preset(name: str, task: str, field: str) -> None:
    """Refuses, naming `field`, a start name `sft:<name>` that names no preset or one of another task's problems."""
    if name not in preset_names():
        raise ConfigError(f"{field}: no SFT start named {name!r}; named starts: "
                          + ", ".join(f"sft:{n}" for n in preset_names()))
    own = PRESET_TASKS[DEFAULT_PRESETS.get(name, name)]
    if own != task:
        raise ConfigError(f"{field}: the start sft:{name} is trained on {own} problems, not on task {task!r}")


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
        model.train()
        inputs, targets, loss_mask = make_batch(task, tokenizer, config, generator, rng)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        loss = (loss * loss_mask.reshape(-1)).sum() / loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
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
    with atomic_directory(out_dir) as tmp:
        policy.save_into(tmp)
        atomic_write_text(os.path.join(tmp, "sft_config.yaml"), dump_yaml(config))
        atomic_write_json(os.path.join(tmp, "sft_summary.json"), summary)
        log = MetricsLog(os.path.join(tmp, "metrics.jsonl"))
        for row in history:
            log.append(row)
    return summary


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
