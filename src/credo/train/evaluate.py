"""Evaluation on held-out (or validation) problems: greedy accuracy, and avg@k / pass@k from k samples per problem."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from tqdm import tqdm

from credo.core.config import MAX_HELD_OUT, MAX_NEW_TOKENS, MAX_SAMPLES, check, check_in
from credo.policy.device import check_device_fields
from credo.core.protocols import Policy, Problem, SamplingConfig, Task


@dataclass(frozen=True)
class EvalConfig:
    """What `credo eval` measures."""

    checkpoint: str = "sft"
    """Policy directory, a run directory (its final/ policy) or 'sft' (the task's SFT start)."""
    task: str = "arith"
    """Task: 'arith', 'arith-long', 'gym:<dataset>' or 'jsonl:<path>' (the default checkpoint follows it)."""
    task_options: dict = field(default_factory=dict)
    """The task's own options (e.g. digits for arith)."""
    n: int = 500
    """Problems of the split to evaluate on."""
    split: str = "heldout"
    """'heldout' (the test set every report reads) or 'validation' (a task's validation split, where runs with
    train.eval_split=validation chose their settings: arith, arith-long, gym:<name>)."""
    k: int = 0
    """> 0 also reports avg@k and pass@k from k samples per problem at temperature 1."""
    max_new_tokens: int = 96
    """Generation limit per completion."""
    device: str = "auto"
    """Where the model runs: auto (CUDA when torch finds a GPU, else the CPU), cpu, cuda or cuda:N (docs/gpu.md)."""
    dtype: str = "float32"
    """float32; bfloat16 (a Hugging Face model's weights, on a GPU); or bfloat16-mixed (float32 weights, matrix
    products in bfloat16 under torch.autocast: a Hugging Face model, on a CPU with AMX/AVX512-BF16 or a GPU)."""
    seed: int = 0
    """Seed of the sampled (avg@k) completions."""

    def __post_init__(self) -> None:
        check_device_fields(self.device, self.dtype, "eval.")
        check(self.split in ("heldout", "validation"), f"eval --split must be 'heldout' or 'validation', "
                                                       f"got {self.split!r}")
        for flag, value, low in (("--n", self.n, 1), ("--k", self.k, 0), ("--max-new-tokens", self.max_new_tokens, 1)):
            check(value >= low, f"eval {flag} must be >= {low}, got {value}")
        check_in(self.n, 1, MAX_HELD_OUT, "eval --n")
        check_in(self.k, 0, MAX_SAMPLES, "eval --k")
        check_in(self.max_new_tokens, 1, MAX_NEW_TOKENS, "eval --max-new-tokens")


@dataclass(frozen=True)
class EvalResult:
    accuracy: float              # greedy accuracy
    n: int
    avg_at_k: float | None = None  # mean accuracy of k samples
    pass_at_k: float | None = None  # share of problems with at least one correct sample
    k: int = 0
    mean_length: float = 0.0

    def as_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}


def complete(policy: Policy, problems: Sequence[Problem], sampling: SamplingConfig, generator: torch.Generator,
             batch_size: int = 256, prompts: Sequence[str] | None = None,
             progress: str | None = None) -> tuple[list[str], list[int]]:
    """Sample one completion per problem in batches -> (texts, lengths in tokens). `progress`: a bar's label."""
    texts, lengths = [], []
    prompts = list(prompts) if prompts is not None else [p.prompt for p in problems]
    starts = range(0, len(prompts), batch_size)
    for start in tqdm(starts, desc=progress, disable=progress is None, unit="batch", dynamic_ncols=True, leave=False):
        ids, mask = policy.encode_prompts(prompts[start:start + batch_size])
        out = policy.sample(ids, mask, sampling, generator)
        for row in range(out.completion_ids.shape[0]):
            texts.append(policy.decode(out.completion_ids[row]))
        lengths.extend(out.completion_mask.sum(1).tolist())
    return texts, lengths


def evaluate(policy: Policy, task: Task, problems: Sequence[Problem], *, k: int = 0, max_new_tokens: int = 96,
             temperature: float = 1.0, seed: int = 0, batch_size: int = 256, progress: bool = False) -> EvalResult:
    """Greedy accuracy on `problems`; with k > 0 also avg@k and pass@k at `temperature`.
    `progress`: a progress bar (with ETA) over the batches of each pass."""
    generator = torch.Generator().manual_seed(seed)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens)
    texts, lengths = complete(policy, problems, greedy, generator, batch_size,
                              progress=f"eval greedy ({len(problems)})" if progress else None)
    correct = [task.is_correct(p, t) for p, t in zip(problems, texts)]
    result = EvalResult(accuracy=sum(correct) / max(len(problems), 1), n=len(problems),
                        mean_length=sum(lengths) / max(len(lengths), 1))
    if k > 0:
        sampled = SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens)
        repeated = [p for p in problems for _ in range(k)]
        texts, _ = complete(policy, repeated, sampled, generator, batch_size,
                            progress=f"eval {k} samples x {len(problems)}" if progress else None)
        hits = torch.tensor([task.is_correct(p, t) for p, t in zip(repeated, texts)], dtype=torch.float32).view(-1, k)
        result = EvalResult(result.accuracy, result.n, float(hits.mean()), float((hits.sum(1) > 0).float().mean()), k,
                            result.mean_length)
    return result
