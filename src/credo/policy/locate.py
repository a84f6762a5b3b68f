"""Where a command's policy is, checked before the command claims its --out (so a wrong path, a run directory
passed for its policy, or a policy that cannot read the task is one line naming the field, with nothing left
behind). One resolution for every command that reads a checkpoint: eval, audit and show alike."""

from __future__ import annotations

import os
from typing import Any

import torch

from credo.core.config import ConfigError
from credo.core.state_io import check_safetensors
from credo.policy.adapters import ADAPTER_WEIGHTS
from credo.policy.base import as_prompt, read_policy_meta
from credo.policy.hf_folder import refuse_custom_code, refuse_pickled_weights
from credo.policy.smollm import ALIASES


PROBE_PROBLEMS = 8
"""Held-out and training problems each whose prompts stand for a generated task's (task_prompts): enough to
meet its every prompt character in practice (a task's prompts share one template)."""


def is_policy(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, name)) for name in ("policy.json", "config.json"))


def check_policy_path(path: str, field: str) -> str:
    """`path`, after refusing, naming `field`, a path that load_policy could not read: a tiny policy (policy.json with
    backend 'tiny') needs its model.safetensors, a LoRA adapter its adapter weights, anything else a Hugging Face
    config.json. '' (the task's SFT
    start) and an alias are resolved later, by load_policy or resolve_checkpoint."""
    if path == "" or path in ALIASES:  # 'sft' is resolve_checkpoint's: load_policy would not know it
        return path
    if not os.path.isdir(path):
        hint = " (the task's SFT start is the default: leave it unset)" if path == "sft" else ""
        raise ConfigError(f"{field}={path!r}: no such directory{hint}")
    if not is_policy(path):
        hint = f" (a training run? its policy is {os.path.join(path, 'final')}, written when it finishes)" \
            if os.path.isfile(os.path.join(path, "config.yaml")) else ""
        raise ConfigError(f"{field}={path!r}: {path} is neither a credo checkpoint (policy.json) nor a Hugging Face "
                          f"model (config.json){hint}")
    meta = read_policy_meta(path)
    backend = meta.get("backend")
    if backend == "hf" and "adapter" in meta:  # a LoRA adapter: its base is read (and its digest checked) on load
        weights = os.path.join(path, ADAPTER_WEIGHTS)
        if not os.path.isfile(weights):
            raise ConfigError(f"{field}={path!r}: {weights} is missing; the adapter is incomplete")
    elif backend == "tiny":
        weights = os.path.join(path, "model.safetensors")
        if not os.path.isfile(weights):
            raise ConfigError(f"{field}={path!r}: {weights} is missing; the checkpoint is incomplete")
    elif not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"{field}={path!r}: its policy.json names backend {backend!r}, which needs a Hugging Face "
                          f"config.json, and {path} has none; the checkpoint is incomplete")
    else:
        refuse_pickled_weights(path, field)
        refuse_custom_code(path, field)
    check_safetensors(path)  # a damaged header: one line naming the file, before --out is touched
    return path


def task_problems(task: Any) -> list[Any]:
    """Problems that stand for all of the task's: every row of a task that holds its rows (jsonl: its train
    and held-out lists), else PROBE_PROBLEMS held-out and PROBE_PROBLEMS training problems, drawn with a
    generator of their own (the run's random streams are untouched)."""
    held, train = getattr(task, "heldout", None), getattr(task, "train", None)
    if isinstance(held, list) and isinstance(train, list):
        return held + train
    drawn = task.train_problems(PROBE_PROBLEMS, torch.Generator().manual_seed(0))
    return task.heldout_problems(PROBE_PROBLEMS) + drawn


def task_prompts(task: Any) -> list[str]:
    """The prompts of task_problems(task)."""
    return [p.prompt for p in task_problems(task)]


def check_task_fits(policy: Any, task: Any, field: str, max_new_tokens: int = 0) -> None:
    """Refuses, naming `field`, a character-level policy (the tiny GPT) whose alphabet lacks a character of
    the task's prompts (check_alphabet; a Hugging Face tokenizer encodes any text), and a task prompt longer
    than the model's context leaves room for (check_context)."""
    alphabet = getattr(getattr(policy, "tokenizer", None), "alphabet", None)
    if isinstance(alphabet, str):
        check_alphabet(alphabet, task, field)
    check_context(policy, task, field, max_new_tokens)


def check_context(policy: Any, task: Any, field: str, max_new_tokens: int) -> None:
    """Every prompt of the task (task_problems), rendered as the policy renders it, plus `max_new_tokens`
    (one token for a backend that stops generating at its context, the tiny GPT) must fit the model's context.
    The first that does not is one line naming its row and both lengths, unless the task asks for truncation
    (`truncate_prompts`): then the policy cuts every prompt to fit (credo.policy.base.fit_prompt)."""
    context = getattr(policy, "context_length", None)
    if not context or not hasattr(policy, "prompt_row"):  # no context stated (or a backend of someone else's)
        return
    needed = 1 if getattr(policy, "clamps_generation", False) else max_new_tokens
    room = context - needed
    if room < 1:
        raise ConfigError(f"{field}: max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                          f"context of {context} tokens")
    if getattr(task, "truncate_prompts", False):
        policy.max_prompt_tokens = room
    for problem in may_not_fit(policy, task_problems(task), room):
        length = len(policy.prompt_row(problem.prompt))
        if length > room:
            row = (f"{task.path}:{problem.data['line']}" if hasattr(task, "path") and "line" in problem.data
                   else f"task {getattr(task, 'name', '')!r}, prompt {problem.prompt[:40]!r}")
            raise ConfigError(f"{field}: {row}: the prompt is {length} tokens, and with {needed} new token(s) "
                              f"(max_new_tokens) it needs {length + needed}, over the model's context of {context} "
                              "tokens; shorten the row or lower max_new_tokens, or set task_options.truncate_prompts"
                              "=true to cut such prompts to fit")


BOUND_SLACK = 8
"""Tokens allowed, in may_not_fit's bound, for the template's own tokens to split differently around a question
than around none (a newline that merges with the next one when the question is empty)."""
BOUND_SAMPLE = 64
"""The longest prompts may_not_fit always tokenises: on them the bound is checked against the exact count."""


def may_not_fit(policy: Any, problems: list[Any], room: int) -> list[Any]:
    """The problems whose prompt might take more than `room` tokens: those check_context must tokenise. A text of
    b UTF-8 bytes is at most b tokens (every token of a byte-level BPE, a SentencePiece with byte fallback or a
    character vocabulary covers at least one byte), so a prompt is at most the tokens of the template around an
    empty question, plus BOUND_SLACK, plus its own bytes; a prompt under `room` by that bound fits, and only the
    others are tokenised (a 100,000-row file of short questions: none). The bound is checked on the
    BOUND_SAMPLE longest prompts, tokenised in any case; where it fails (a tokenizer whose normaliser expands
    text) every prompt is."""

    def size(problem: Any) -> int:
        prompt = as_prompt(problem.prompt)
        return len(prompt.user.encode("utf-8", "surrogatepass")) + len((prompt.system or "").encode("utf-8"))

    empty = len(policy.prompt_row(""))
    sizes = [size(p) for p in problems]
    longest = sorted(range(len(problems)), key=sizes.__getitem__, reverse=True)[:BOUND_SAMPLE]
    if any(len(policy.prompt_row(problems[i].prompt)) > empty + BOUND_SLACK + sizes[i] for i in longest):
        return problems
    chosen = set(longest)
    return [p for i, p in enumerate(problems) if i in chosen or empty + BOUND_SLACK + sizes[i] > room]


def check_alphabet(alphabet: str, task: Any, field: str) -> None:
    """Refuses, naming `field`, an alphabet (a tiny policy's, from the policy or its policy.json) that lacks a
    character of the task's prompts: it holds arith's characters only, so a gym: or jsonl: task of words
    needs a Hugging Face start."""
    missing = sorted(set("".join(task_prompts(task))) - set(alphabet))
    if missing:
        shown = ", ".join(repr(c) for c in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise ConfigError(f"{field}: this tiny policy cannot read the prompts of task {getattr(task, 'name', '')!r} "
                          f"(characters {shown} are not in its alphabet); it reads arith tasks only: use a Hugging "
                          "Face start (e.g. smollm2-135m after `credo sft`, README 'Real models and tasks')")
