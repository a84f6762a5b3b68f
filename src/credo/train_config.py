"""The configuration of a `credo train` run: one frozen dataclass, loaded with its method's recipe defaults."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from credo import methods
from credo.config import ConfigError, check, from_dict, load_config, merge, parse_overrides, to_dict
from credo.loss import LossConfig
from credo.policy.base import SamplingConfig
from credo.strategies import STRATEGIES
from credo.strategies.resets import ResetConfig


@dataclass(frozen=True)
class TrainConfig:
    """Everything a `credo train` run needs. Method recipes (dapo, gspo, dr_grpo) change defaults only.

    method: estimator or recipe name (`credo methods`). credit: the estimator's own options.
    task/task_options: task name ('arith', 'gym:<dataset>', 'jsonl:<path>') and its options.
    start: policy to start from: a credo checkpoint, any Hugging Face model directory, or
    'smollm2-135m' ('' = the cached SFT start of the tiny policy). lora_r > 0 trains LoRA adapters
    (rank lora_r, alpha lora_alpha, on lora_targets) instead of every weight (HF models only).
    steps: optimisation steps (one batch of prompts each); max_generated_tokens > 0 stops earlier once
    that many tokens were sampled (strategies and estimators both count).
    prompts_per_step x group_size completions per step, sampled at temperature/top_p, up to
    max_new_tokens each. eval_every_tokens > 0 evaluates whenever generated tokens cross a multiple of
    it (instead of every eval_every steps), so methods with different step costs share one x axis.
    epochs x minibatches AdamW steps per batch (lr, beta1, beta2, weight_decay,
    grad_clip): ONE schedule for every method, set here (1 x 4, as the public SRPO code gives GRPO
    and SRPO alike: verl ppo_epochs 1, mini-batch 8 of 32 prompts); a method whose paper prescribes
    another sets it in its recipe (credo.methods), and every run records it in config.yaml. strategy: 'plain', 'dynamic' or 'resets'; dynamic_max_rounds bounds DAPO's
    resampling; reset: the RRPO/SRPO reset settings (group_size is unused by resets).
    overlong_buffer > 0 applies DAPO's overlong penalty over the last `overlong_buffer` tokens of
    max_new_tokens, scaled by overlong_penalty. eval_every steps: greedy accuracy on eval_n held-out
    problems (final_eval_n at the end). checkpoint_every steps: atomic checkpoint (the last
    keep_checkpoints are kept). data_parallel: split each step's prompts over the processes of an
    accelerate/torchrun launch (plain strategy; see credo.distributed). seed: every random draw of the run.
    """

    method: str = "grpo"
    credit: dict = field(default_factory=dict)
    task: str = "arith"
    task_options: dict = field(default_factory=dict)
    start: str = ""
    lora_r: int = 0
    lora_alpha: int = 16
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    steps: int = 150
    max_generated_tokens: int = 0
    prompts_per_step: int = 8
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    lr: float = 2e-5
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    epochs: int = 1
    minibatches: int = 4
    loss: LossConfig = field(default_factory=LossConfig)
    strategy: str = "plain"
    dynamic_max_rounds: int = 4
    reset: ResetConfig = field(default_factory=ResetConfig)
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    eval_every: int = 10
    eval_every_tokens: int = 0
    eval_n: int = 200
    final_eval_n: int = 500
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    data_parallel: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.steps > 0, f"train.steps must be > 0, got {self.steps}")
        check(self.prompts_per_step > 0, f"train.prompts_per_step must be > 0, got {self.prompts_per_step}")
        check(self.group_size >= 2, f"train.group_size must be >= 2 (group baselines need two samples), got {self.group_size}")
        check(self.temperature > 0, f"train.temperature must be > 0 (0 is greedy: every group would be identical "
              f"and every advantage 0), got {self.temperature}")
        check(0 < self.top_p <= 1, f"train.top_p must be in (0, 1], got {self.top_p}")
        check(self.max_new_tokens > 0, f"train.max_new_tokens must be > 0, got {self.max_new_tokens}")
        check(math.isfinite(self.lr) and self.lr > 0, f"train.lr must be a finite number > 0, got {self.lr}")
        check(0 <= self.beta1 < 1, f"train.beta1 must be in [0, 1), got {self.beta1}")
        check(0 <= self.beta2 < 1, f"train.beta2 must be in [0, 1), got {self.beta2}")
        check(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")
        check(self.grad_clip > 0, f"train.grad_clip must be > 0 (a clip norm; <= 0 would freeze or reverse the "
              f"update), got {self.grad_clip}")
        check(self.dynamic_max_rounds >= 1, f"train.dynamic_max_rounds must be >= 1, got {self.dynamic_max_rounds}")
        check(self.lora_r >= 0 and self.lora_alpha > 0, f"train.lora_r must be >= 0 and train.lora_alpha > 0, "
              f"got {self.lora_r}/{self.lora_alpha}")
        check(self.overlong_penalty >= 0, f"train.overlong_penalty must be >= 0, got {self.overlong_penalty}")
        check(self.reset.prompt_temperature > 0, f"train.reset.prompt_temperature must be > 0, got {self.reset.prompt_temperature}")
        check(self.epochs > 0 and self.minibatches > 0, "train.epochs and train.minibatches must be > 0")
        check(self.strategy in STRATEGIES.names(), f"train.strategy must be one of {tuple(STRATEGIES.names())}, got {self.strategy!r}")
        check(0 <= self.overlong_buffer < self.max_new_tokens, f"train.overlong_buffer must be in [0, max_new_tokens), got {self.overlong_buffer}")
        check(self.eval_every > 0 and self.eval_n > 0 and self.final_eval_n >= 0, "train.eval_every/eval_n must be > 0")
        check(self.eval_every_tokens >= 0 and self.max_generated_tokens >= 0, "train.eval_every_tokens/max_generated_tokens must be >= 0")
        check(self.checkpoint_every > 0 and self.keep_checkpoints > 0, "train.checkpoint_every/keep_checkpoints must be > 0")
        check(not self.data_parallel or self.strategy == "plain",
              f"train.data_parallel supports strategy 'plain' only, got {self.strategy!r}")
        try:
            recipe = methods.resolve(self.method)
        except KeyError as err:
            raise ConfigError(f"train.method: {err.args[0]}") from None
        from credo import credit as credit_registry
        credit_registry.get(recipe.estimator).make_config(self.credit, prefix="train.credit.")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.max_new_tokens)


def load_train_config(path: str | None = None, overrides: list[str] | None = None,
                      extra: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults <- method recipe <- YAML <- `extra` <- overrides. The recipe is looked up from the
    method named by the user (in the file, `extra` or the overrides)."""
    probe = load_config(TrainConfig, path, overrides, base=extra, prefix="train.")
    recipe = methods.resolve(probe.method).defaults
    user = merge(merge(_read_yaml(path), extra or {}), parse_overrides(overrides or []))
    return from_dict(TrainConfig, merge(recipe, user), prefix="train.")


def _read_yaml(path: str | None) -> dict:
    """The mapping in YAML file `path` ({} for None or an empty file); errors name the file."""
    if not path:
        return {}
    import yaml
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key not in ("credit", "task_options"):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_from_run(run_dir: str) -> TrainConfig:
    """The config a run directory was made with. An empty or truncated config.yaml is an error, never defaults."""
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir} has no config.yaml: not a credo run directory")
    data = _read_yaml(path)
    if not data:
        raise ConfigError(f"{path} is empty (truncated?); the run cannot be resumed")
    # credo writes every field in order, `method` first and `seed` last: a file cut short lacks `seed`
    missing = [k for k in ("method", "seed") if k not in data]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join('train.' + m for m in missing)} (truncated?); the run cannot be resumed")
    return from_dict(TrainConfig, data, prefix="train.")


def resume_differences(run: TrainConfig, requested: dict[str, Any]) -> list[str]:
    """The settings in `requested` (a nested dict of fields the user passed) that differ from the run's."""
    merged = from_dict(TrainConfig, merge(to_dict(run), requested), prefix="train.")
    old, new = _flatten(to_dict(run)), _flatten(to_dict(merged))
    return [f"train.{k}: run has {old.get(k)!r}, command asks {new.get(k)!r}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO soft overlong punishment: 0 up to max_len - buffer, then linear down to -factor at max_len."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    excess = (lengths.float() - (max_len - buffer)).clamp(min=0)
    return -factor * (excess / buffer).clamp(max=1.0)
