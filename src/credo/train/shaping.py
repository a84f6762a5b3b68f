"""DAPO's overlong reward shaping: a soft penalty on completions that reach into the last `buffer` tokens of the
generation limit, with the buffer optionally fitted so that no worked solution of the task is penalised."""

from __future__ import annotations

from typing import Any, Callable

import torch

from credo.core.config import ConfigError

OVERLONG_FIT_PROBLEMS = 256  # training problems whose worked solutions bound the penalised region


def overlong_buffer_for_task(task: Any, encode: Callable[[list[str]], torch.Tensor], max_new_tokens: int,
                             buffer: int) -> tuple[int, int]:
    """(buffer used, longest worked solution): the largest buffer <= `buffer` whose penalised region, the last
    `buffer` of `max_new_tokens` tokens, no worked solution of OVERLONG_FIT_PROBLEMS training problems reaches.
    The problems come from a generator of their own (seed 0), so the run's own problem stream is untouched.
    A worked solution is the task's reference completion (`reference_solution`'s pieces joined: on `arith` the
    solution lines, on a `gym:` or `jsonl:` task the worked solution with its answer line); problems without
    one are skipped, and a task with none is a ConfigError naming train.overlong_fit_task.
    `encode` maps texts to a [N, L] completion mask (the policy's tokens, EOS included)."""
    problems = task.train_problems(OVERLONG_FIT_PROBLEMS, torch.Generator().manual_seed(0))
    reference = getattr(task, "reference_solution", lambda problem: None)
    solutions = ["".join(pieces) for pieces in map(reference, problems) if pieces]
    if not solutions:
        raise ConfigError(f"train.overlong_fit_task fits DAPO's overlong buffer to the task's worked solutions, "
                          f"and task {getattr(task, 'name', task)!r} has none: set train.overlong_fit_task=false "
                          "(the buffer is then train.overlong_buffer as set)")
    longest = int(encode(solutions).sum(dim=1).max())
    return max(0, min(buffer, max_new_tokens - longest)), longest


def fitted_overlong_buffer(config: Any, task: Any, policy: Any) -> tuple[int, int | None]:
    """(buffer, longest worked solution) a run applies: `overlong_buffer` as set, or fitted to the task
    (`overlong_fit_task`, overlong_buffer_for_task; the longest solution is None when not fitted)."""
    if not (config.overlong_fit_task and config.overlong_buffer > 0):
        return config.overlong_buffer, None
    return overlong_buffer_for_task(task, lambda texts: policy.encode_completions(texts)[1],
                                    config.sampling.max_new_tokens, config.overlong_buffer)


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO soft overlong punishment: 0 up to max_len - buffer, then linear down to -factor at max_len."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    excess = (lengths.float() - (max_len - buffer)).clamp(min=0)
    return -factor * (excess / buffer).clamp(max=1.0)
