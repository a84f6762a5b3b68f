"""The configuration of a `credo train` run: one frozen dataclass of settings, the defaults that depend on the start
and the machine, and a recorded run's config read back.

credo.train.plan.plan_run loads it (defaults <- recipe <- YAML <- flags <- --set) and resolves what it names once,
into a Plan; a bad credit option fails there with its full path (`train.credit.k`). Every field is documented by
the string under it (`credo train --help-config` lists them).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any

from credo.credit.compose import recorded_options
from credo.integrations import tracking
from credo.core.config import (MAX_EPOCHS, MAX_GROUP, MAX_HELD_OUT, MAX_NEW_TOKENS, MAX_ROUNDS,
                               MAX_STEP_COMPLETIONS, ConfigError, check, check_in, from_dict, merge, read_yaml,
                               to_dict)
from credo.policy.adapters import LoraSettings
from credo.policy.device import check_device_fields
from credo.core.loss import LossConfig
from credo.core.protocols import SamplingConfig
from credo.strategies.resets import ResetConfig
from credo.train import methods
from credo.policy.smollm import ALIASES


@dataclass(frozen=True)
class TrainConfig:
    """Everything a `credo train` run needs. A method's recipe (dapo, gspo, dr_grpo, rrpo, srpo) changes
    defaults only; every run records the resolved config in its config.yaml."""

    method: str = "grpo"
    """Estimator or recipe name (`credo methods`), optionally with estimator options: 'shuffled:of=rredcot'."""
    credit: dict = field(default_factory=dict)
    """The estimator's own options, as a mapping (e.g. `--set credit.lam=0.5`); checked against the estimator's
    config when the run is planned (credo.train.plan), and recorded in config.yaml with every default filled in."""
    task: str = "arith"
    """Task: 'arith', 'arith-long', 'gym:<reasoning-gym dataset>' or 'jsonl:<path>'."""
    task_options: dict = field(default_factory=dict)
    """The task's own options (e.g. digits, max_terms for arith)."""
    start: str = ""
    """Policy to start from: a credo checkpoint, a Hugging Face model directory or 'smollm2-135m'
    ('' = the cached SFT start of the tiny policy for `task`)."""
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"omit_default": True})
    """LoRA adapters instead of full-weight training (lora.r > 0; a Hugging Face start). Left out of config.yaml
    while off."""
    steps: int = 150
    """Optimisation steps (one batch of prompts each)."""
    max_generated_tokens: int = 0
    """> 0 stops earlier, once this many tokens were sampled (strategies and estimators both count)."""
    prompts_per_step: int = 8
    """Prompts drawn per step."""
    group_size: int = 8
    """Completions sampled per prompt (unused by the resets strategy: see reset.n_fresh/n_reset)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How completions are sampled (temperature, top_p, max_new_tokens; also read as top-level keys)."""
    lr: float = 2e-5
    """AdamW learning rate."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.99
    """AdamW beta2."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    fused_adamw: bool = False
    """AdamW as one fused kernel (torch's `fused=True`; what TRL and transformers use by default): ~8x faster
    optimiser steps on a CPU, results that differ from the default loop's in the last bit (so off: every committed
    run stays reproducible)."""
    epochs: int = 1
    """Passes over each batch. With `minibatches`, ONE schedule for every method (1 x 4, as the public SRPO
    code gives GRPO and SRPO alike: verl ppo_epochs 1, mini-batch 8 of 32 prompts); a method whose paper
    prescribes another sets it in its recipe (credo.train.methods)."""
    minibatches: int = 4
    """AdamW steps per pass over a batch."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The policy loss."""
    strategy: str = "plain"
    """Rollout strategy: 'plain', 'dynamic' (DAPO's resampling of uniform groups) or 'resets' (RRPO/SRPO)."""
    dynamic_max_rounds: int = 4
    """Resampling rounds per step of the dynamic strategy."""
    reset: ResetConfig = field(default_factory=ResetConfig)
    """The RRPO/SRPO reset settings (strategy 'resets')."""
    overlong_buffer: int = 0
    """> 0 applies DAPO's overlong penalty over the last `overlong_buffer` tokens of max_new_tokens."""
    overlong_penalty: float = 1.0
    """The overlong penalty at max_new_tokens (linear from 0 over the buffer)."""
    overlong_fit_task: bool = False
    """True shrinks overlong_buffer so that no worked solution of the task (the longest of 256 training problems,
    in the policy's tokens, EOS included) lies in the penalised region: DAPO puts its buffer beyond the expected
    length (4,096 tokens past 16,384), so a correct solution of ordinary length is never penalised. The buffer
    used and the longest solution are in summary.json (`overlong_buffer_used`, `longest_worked_solution`)."""
    eval_every: int = 10
    """Steps between held-out evaluations (greedy accuracy on eval_n problems)."""
    eval_every_tokens: int = 0
    """> 0 evaluates whenever generated tokens cross a multiple of it instead (methods with different step
    costs then share one x axis)."""
    eval_n: int = 200
    """Held-out problems of each evaluation during training."""
    final_eval_n: int = 500
    """Held-out problems of the final evaluation (0: none)."""
    eval_split: str = field(default="heldout", metadata={"omit_default": True})
    """Where the curve and the final evaluation are measured: 'heldout' (the test set), or 'validation', a fixed
    set of training-split problems that this run then never trains on (arith and gym: tasks), for choosing between
    methods or settings without looking at the held-out set (the selection rule of docs/methods.md). Left out of
    config.yaml at its default."""
    credit_log_every: int = field(default=10, metadata={"omit_default": True})
    """Every this many steps, credit_log_rows rows of the batch with their per-token credit and its
    parts (GRPO part, the method's part, weights, clipped tokens) go to credit/step-N.safetensors in the run
    directory (`credo show --run RUN --step N`; credo.train.credit_log); 0: none. It reads what the step computed
    (no model call, no random draw); a file is about rows x tokens x 45 bytes. Left out of config.yaml at its
    default."""
    credit_log_rows: int = field(default=4, metadata={"omit_default": True})
    """Rows each credit file keeps (1..256), taken group by group, groups whose rewards differ first. Left out of
    config.yaml at its default."""
    checkpoint_every: int = 10
    """Steps between atomic checkpoints."""
    keep_checkpoints: int = 2
    """Checkpoints kept (the latest ones)."""
    data_parallel: bool = False
    """Split each step's prompts over the processes of an accelerate/torchrun launch (plain strategy only;
    see credo.train.distributed)."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers that also get each metrics row, the config and the summary (metrics.jsonl stays the
    record): any of tensorboard, wandb, mlflow, trackio (e.g. `--set report_to=tensorboard,wandb`); none by
    default. Each needs its extra (`pip install 'credo[wandb]'`); stores and names: docs/tracking.md."""
    device: str = "auto"
    """Where the model runs: auto (CUDA when torch finds a GPU, else the CPU), cpu, cuda or cuda:N (docs/gpu.md)."""
    dtype: str = "float32"
    """float32; bfloat16 (a Hugging Face model's weights, on a GPU); or bfloat16-mixed (float32 weights, matrix
    products in bfloat16 under torch.autocast: a Hugging Face model, on a CPU with AMX/AVX512-BF16 or a GPU)."""
    seed: int = 0
    """Seed of every random draw of the run."""

    def __post_init__(self) -> None:
        check_device_fields(self.device, self.dtype, "train.")
        check(self.prompts_per_step > 0, f"train.prompts_per_step must be > 0, got {self.prompts_per_step}")
        check(self.group_size >= 2,
              f"train.group_size must be >= 2 (group baselines need two samples), got {self.group_size}")
        check_in(self.group_size, 2, MAX_GROUP, "train.group_size")
        check(self.prompts_per_step * self.group_size <= MAX_STEP_COMPLETIONS,
              f"train.prompts_per_step x train.group_size must be <= {MAX_STEP_COMPLETIONS:,} completions a step, "
              f"got {self.prompts_per_step} x {self.group_size}")
        self._check_sampling()
        check(math.isfinite(self.lr) and self.lr > 0, f"train.lr must be a finite number > 0, got {self.lr}")
        check(0 <= self.beta1 < 1, f"train.beta1 must be in [0, 1), got {self.beta1}")
        check(0 <= self.beta2 < 1, f"train.beta2 must be in [0, 1), got {self.beta2}")
        check(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")
        check(self.grad_clip > 0, f"train.grad_clip must be > 0 (a clip norm; <= 0 would freeze or reverse the "
              f"update), got {self.grad_clip}")
        check_in(self.dynamic_max_rounds, 1, MAX_ROUNDS, "train.dynamic_max_rounds")
        check(self.overlong_penalty >= 0, f"train.overlong_penalty must be >= 0, got {self.overlong_penalty}")
        check(self.reset.prompt_temperature > 0,
              f"train.reset.prompt_temperature must be > 0, got {self.reset.prompt_temperature}")
        check(self.epochs > 0 and self.minibatches > 0,
              f"train.epochs and train.minibatches must be > 0, got {self.epochs} and {self.minibatches}")
        check_in(self.epochs, 1, MAX_EPOCHS, "train.epochs")
        # more mini-batches than a step's completions leaves some empty (skipped), which is allowed: a reset
        # method's batch of suffixes is smaller than prompts_per_step x group_size
        check_in(self.minibatches, 1, MAX_STEP_COMPLETIONS, "train.minibatches")
        check(0 <= self.overlong_buffer < self.sampling.max_new_tokens,
              f"train.overlong_buffer must be in [0, max_new_tokens), got {self.overlong_buffer}")
        for name in ("steps", "eval_every", "eval_n", "checkpoint_every", "keep_checkpoints"):
            check(getattr(self, name) > 0, f"train.{name} must be > 0, got {getattr(self, name)}")
        for name in ("final_eval_n", "eval_every_tokens", "max_generated_tokens"):
            check(getattr(self, name) >= 0, f"train.{name} must be >= 0, got {getattr(self, name)}")
        check_in(self.eval_n, 1, MAX_HELD_OUT, "train.eval_n")
        check_in(self.final_eval_n, 0, MAX_HELD_OUT, "train.final_eval_n")
        check_in(self.credit_log_every, 0, 1_000_000, "train.credit_log_every")
        check_in(self.credit_log_rows, 1, 256, "train.credit_log_rows")
        check(self.eval_split in ("heldout", "validation"),
              f"train.eval_split must be 'heldout' or 'validation', got {self.eval_split!r}")
        object.__setattr__(self, "report_to", tracking.checked_names(self.report_to, "train.report_to"))
        check(not self.data_parallel or self.strategy == "plain",
              f"train.data_parallel supports strategy 'plain' only, got {self.strategy!r}")

    def _check_sampling(self) -> None:
        s = self.sampling
        check(s.temperature > 0, f"train.sampling.temperature must be > 0 (0 is greedy: every group would be "
              f"identical and every advantage 0), got {s.temperature}")
        check(0 < s.top_p <= 1, f"train.sampling.top_p must be in (0, 1], got {s.top_p}")
        check(s.max_new_tokens > 0, f"train.sampling.max_new_tokens must be > 0, got {s.max_new_tokens}")
        check_in(s.max_new_tokens, 1, MAX_NEW_TOKENS, "train.sampling.max_new_tokens")


# A Hugging Face model on a CPU. The field defaults (8 prompts x 8 completions, 200- and 500-problem
# evaluations) are sized for the tiny GPT; with SmolLM2-135M on 2 cores one such step with its evaluations
# ran past 15 minutes. These sizes give a step of ~15-20 s and evaluations of ~10-30 s there, so the
# README's 5-step command finishes in under 5 minutes (measured in docs/results/smollm2/); the 8
# completions of a step make one mini-batch (one update per batch, as TRL's GRPOTrainer by default; four
# mini-batches of two completions would be four very noisy updates). Any setting the user gives (YAML,
# flags, --set) or a recipe gives wins over them.
CPU_HF_DEFAULTS: dict[str, Any] = {"prompts_per_step": 2, "group_size": 4, "sampling": {"max_new_tokens": 64},
                                   "minibatches": 1, "eval_every": 5, "eval_n": 20, "final_eval_n": 50,
                                   "checkpoint_every": 5}


# A pretrained Hugging Face model on any device: the tiny GPT's learning rate (2e-5) collapsed SmolLM2-135M's
# SFT start (held-out greedy accuracy 0.33 -> 0.00 within 10 GRPO steps, two of them with a non-zero
# gradient: Adam's momentum keeps moving every weight after a noisy step); at 2e-6 GRPO gained +8.7
# points in 80 steps (docs/results/smollm2/). TRL's GRPOConfig default is 1e-6.
HF_DEFAULTS: dict[str, Any] = {"lr": 2e-6}


def machine_defaults(start: str) -> dict[str, Any]:
    """Defaults for the start and the machine it trains on: HF_DEFAULTS and CPU_HF_DEFAULTS when `start` is a
    Hugging Face model (the smollm2-135m alias, or a directory with a config.json that is not a tiny credo
    policy); {} for the tiny GPT. `credo train` runs on the CPU whatever accelerator the host has (GPU
    training goes through the TRL and verl integrations), so the CPU sizes apply on every host and a run's
    config does not depend on the machine it was configured on."""
    return {**HF_DEFAULTS, **CPU_HF_DEFAULTS} if is_hf_start(start) else {}


def is_hf_start(start: str) -> bool:
    """Whether `start` names a Hugging Face model (checked without loading it)."""
    if start in ALIASES:
        return True
    meta = os.path.join(start, "policy.json")
    if start and os.path.exists(meta):
        try:
            with open(meta) as f:
                return json.load(f).get("backend") == "hf"
        except (OSError, ValueError, AttributeError):  # unreadable: the loader names the file when it reads it
            return False
    return bool(start) and os.path.isfile(os.path.join(start, "config.json"))


def train_config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """TrainConfig from a nested mapping (errors name `train.<field>`)."""
    return from_dict(TrainConfig, data, prefix="train.")


def flatten_config(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'loss.eps_low': 0.2, ...}: a config dict's fields by dotted path (task_options and empty sections whole)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key != "task_options":
            flat.update(flatten_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def comparable_config(tree: dict[str, Any]) -> dict[str, Any]:
    """flatten_config of a config dict (to_dict of a TrainConfig, or what a checkpoint recorded) with its credit
    options as the method's estimator's whole config, so that an option at its default compares equal whether a
    run recorded it (`credit: {eps: 1.0e-06}`) or left it out (`credit: {}`, as an older credo wrote them)."""
    tree = dict(tree)
    try:
        spec = methods.estimator_of(str(tree.get("method", "")))
        tree["credit"] = recorded_options(spec.make_config(dict(tree.get("credit") or {})))
    except (ValueError, KeyError, TypeError):
        pass  # options the estimator refuses: compared as recorded, so the difference shows
    return flatten_config(tree)


DEFAULTS_OF_THEIR_TIME: dict[str, dict[str, Any]] = {"ibpo": {"preserve_mass": True}, "gtpo": {"form": "weights"}}
"""Estimator options whose default changed, with the default they had before. Since then a run records every
option of its estimator (and of each estimator it wraps), so a record that lacks one was written while this
default held: `as_recorded` fills it in, and an old run keeps meaning what it trained."""


def as_recorded(method: str, credit: dict[str, Any]) -> dict[str, Any]:
    """A recorded run's credit options (`method`: the run's method field) with DEFAULTS_OF_THEIR_TIME filled in
    where the record leaves them out, at its own level and at every level it wraps (`of`, `options`)."""
    try:
        name = methods.estimator_of(method).name
    except (ValueError, KeyError, TypeError):
        return credit  # an unknown method: compared as recorded, so the difference shows
    then = DEFAULTS_OF_THEIR_TIME.get(name, {})
    out = {**{k: v for k, v in then.items() if k not in credit}, **credit}
    if isinstance(out.get("of"), str) and out["of"]:
        out["options"] = as_recorded(out["of"], dict(out.get("options") or {}))
    return out


def config_from_run(run_dir: str) -> TrainConfig:
    """The config a run directory was made with. An empty or truncated config.yaml is an error, never defaults."""
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir} has no config.yaml: not a credo run directory")
    data = read_yaml(path)
    if not data:
        raise ConfigError(f"{path} is empty (truncated?); the run cannot be resumed")
    # credo writes every field in order, `method` first and `seed` last: a file cut short lacks `seed`
    missing = [k for k in ("method", "seed") if k not in data]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join('train.' + m for m in missing)} (truncated?); the "
                          "run cannot be resumed")
    # a run recorded before `device` existed trained on the CPU (credo ran nowhere else): it continues there
    data = nest_lora(nest_sampling(data))
    data["credit"] = as_recorded(str(data["method"]), dict(data.get("credit") or {}))
    return train_config_from_dict({**data, "device": data.get("device", RECORDED_BEFORE_DEVICES)})


LEGACY_LORA = {"lora_r": "r", "lora_alpha": "alpha", "lora_targets": "target_modules"}
"""The flat LoRA keys of a run recorded before `lora` was a section -> their field in it."""


def nest_lora(data: dict[str, Any]) -> dict[str, Any]:
    """A recorded run's config with its flat LoRA keys (LEGACY_LORA: every run under docs/results/ records them)
    moved into `lora`; dropped when their rank is 0 (LoRA was off: the other two did nothing)."""
    flat = {k: data[k] for k in LEGACY_LORA if k in data}
    if not flat:
        return data
    rest = {k: v for k, v in data.items() if k not in LEGACY_LORA}
    if not flat.get("lora_r"):
        return rest
    return {**rest, "lora": {LEGACY_LORA[k]: v for k, v in flat.items()}}


def nest_sampling(data: dict[str, Any]) -> dict[str, Any]:
    """A recorded run's config with the sampling settings it kept at the top level (temperature, top_p,
    max_new_tokens: runs recorded before `sampling` was a section, such as those under docs/results/) moved
    into `sampling`."""
    flat = [f.name for f in fields(SamplingConfig) if f.name in data]
    if not flat or not isinstance(data.get("sampling", {}), dict):
        return data
    rest = {k: v for k, v in data.items() if k not in flat}
    return {**rest, "sampling": {**data.get("sampling", {}), **{k: data[k] for k in flat}}}


RECORDED_BEFORE_DEVICES = "cpu"
"""The device of a run whose config.yaml predates the `device` field."""


def resume_differences(run: TrainConfig, requested: dict[str, Any]) -> list[str]:
    """The settings in `requested` (a nested dict of fields the user passed) that differ from the run's."""
    base = to_dict(run)
    if requested.get("method", run.method) != run.method:
        del base["credit"]  # another method's estimator has other options: the method is the difference
    merged = train_config_from_dict(merge(base, requested))
    old, new = flatten_config(to_dict(run)), flatten_config(to_dict(merged))
    return [f"train.{k}: run has {old.get(k)!r}, command asks {new.get(k)!r}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
