"""The tiny policy's SFT settings (SFTConfig) and its named starts (SFT_PRESETS): each arithmetic task's default
start and the skilled starts selected as `sft:<name>` (credo.train.sft trains and caches them)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from credo.core.config import MAX_HELD_OUT, MAX_STEP_COMPLETIONS, ConfigError, check, check_in
from credo.policy.gpt import GPTConfig
from credo.tasks.arith import PRESETS as TASK_PRESETS
from credo.tasks.arith import ArithConfig


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
