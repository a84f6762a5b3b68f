"""How long a `credo train` run will take, estimated before its first step (the progress bar shows it).

tqdm's own ETA needs one finished step, which for a Hugging Face model on a CPU is half a minute or more.
Before that, the trainer measures two small pieces of the real work on the run's own model and shapes:

    generation: `probe_tokens` sampled tokens for the step's B = prompts_per_step x group_size rows,
                scaled to max_new_tokens (an upper bound: completions that stop early cost less);
    update:     one forward+backward over one mini-batch, (B / minibatches, prompt + max_new_tokens)
                tokens (its gradients are discarded);

    step     = generation + epochs x minibatches x update (x 4/3 with the no-grad re-scoring of old
               log-probabilities, which one epoch of one mini-batch skips)
    run      = remaining steps (fewer if a token budget ends the run first) x step
               + evaluations x seconds of the step-0 evaluation (scaled by size)

The estimate is for the plain GRPO-shaped step: estimators and strategies that sample or score more (MC,
RREDCoT, resets) take longer, and tqdm's measured ETA replaces the estimate after the first step. The
timing runs under `torch.random.fork_rng` and leaves weights, gradients and every random stream of the run
untouched, so a run with a progress bar is the same run as one without.
"""

from __future__ import annotations

import math
import time

import torch

from credo.core.protocols import SamplingConfig


def format_seconds(seconds: float) -> str:
    """'45s', '3m20s', '1h05m'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def time_step_pieces(policy, prompt: object, rows: int, max_new_tokens: int, update_rows: int | None = None,  # noqa: ANN001
                     probe_tokens: int = 4) -> tuple[float, float]:
    """(seconds to sample max_new_tokens for `rows` copies of `prompt`, seconds of one forward+backward over
    one mini-batch: (update_rows, prompt + max_new_tokens) tokens), measured on `policy` without changing it
    (weights, gradients already there, random state)."""
    probe_tokens = max(1, min(probe_tokens, max_new_tokens))
    update_rows = max(1, min(update_rows or rows, rows))
    was_training = policy.model.training
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    saved = [p.grad for p in trainable]
    with torch.random.fork_rng(devices=[]):
        prompt_ids, prompt_mask = policy.encode_prompts([prompt] * rows)
        began = time.perf_counter()
        policy.sample(prompt_ids, prompt_mask, SamplingConfig(temperature=1.0, max_new_tokens=probe_tokens),
                      torch.Generator().manual_seed(0))
        generation = (time.perf_counter() - began) * max_new_tokens / probe_tokens
        completion = torch.full((update_rows, max_new_tokens), policy.pad_id, dtype=torch.long)
        mask = torch.ones_like(completion, dtype=torch.bool)
        for p in trainable:  # backward accumulates into an existing .grad in place: start from none
            p.grad = None
        began = time.perf_counter()
        logprobs, _ = policy.score(prompt_ids[:update_rows], prompt_mask[:update_rows], completion, mask)
        logprobs.sum().backward()
        update = time.perf_counter() - began
    for p, grad in zip(trainable, saved):
        p.grad = grad
    policy.model.train(was_training)
    return generation, update


def estimate_run_seconds(step_pieces: tuple[float, float], updates_per_step: int, steps_left: int, evaluations: int,
                         eval_seconds: float, final_eval_scale: float, rescore: bool = True) -> float:
    """Seconds of the rest of a run from the timed pieces of one step (see the module docstring):
    step = generation + updates_per_step x mini-batch update (+ a third of that again for the no-grad
    re-scoring of old log-probabilities, which an on-policy schedule skips)."""
    generation, update = step_pieces
    step = generation + updates_per_step * update * (4 / 3 if rescore else 1.0)
    return steps_left * step + evaluations * eval_seconds + final_eval_scale * eval_seconds


def steps_within(steps_left: int, tokens_left: int, tokens_per_step: int, budgeted: bool) -> int:
    """Steps still to run: `steps_left`, or fewer when a token budget ends the run first (a step is counted
    at its full length, tokens_per_step = rows x max_new_tokens, so this is a lower bound on the steps)."""
    if not budgeted:
        return max(0, steps_left)
    return max(0, min(steps_left, math.ceil(max(tokens_left, 0) / max(tokens_per_step, 1))))


def evaluations_left(step: int, steps: int, eval_every: int) -> int:
    """Curve evaluations still due after `step` (by step count; a token-based schedule is approximated)."""
    return max(0, math.floor(steps / eval_every) - math.floor(step / eval_every))

def steps_ahead(trainer) -> int:  # noqa: ANN001  (a credo.train.trainer.Trainer)
    """Steps still to run: the step count, or fewer when the token budget ends the run first (each step
    counted at full length, steps_within)."""
    c = trainer.config
    return steps_within(c.steps - trainer.step, c.max_generated_tokens - trainer.tokens_generated,
                        c.prompts_per_step * c.group_size * c.sampling.max_new_tokens, c.max_generated_tokens > 0)


def seconds_left(trainer) -> float:  # noqa: ANN001  (a credo.train.trainer.Trainer)
    """The rest of a run, from two timed pieces of one step and the last evaluation; evaluations count only when
    one was timed in this process (a resumed run has none yet)."""
    c = trainer.config
    prompt = trainer.task.train_problems(1, torch.Generator().manual_seed(0))[0].prompt
    rows = c.prompts_per_step * c.group_size
    pieces = time_step_pieces(trainer.policy, prompt, rows, c.sampling.max_new_tokens, -(-rows // c.minibatches))
    steps_left = steps_ahead(trainer)
    return estimate_run_seconds(pieces, c.epochs * c.minibatches, steps_left,
                                evaluations_left(trainer.step, trainer.step + steps_left, c.eval_every),
                                getattr(trainer, "eval_seconds", 0.0), c.final_eval_n / max(c.eval_n, 1),
                                rescore=not trainer.on_policy)
