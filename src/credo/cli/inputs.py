"""What a command reads, checked before it claims its --out: the task, the checkpoint, and that the one fits the
other. It loads the task and (for a context check) the policy, so a command imports it when it runs, not when
`credo --help` builds the parser."""

from __future__ import annotations

from credo.policy import bind_task, check_task_fits, load_policy, read_policy_meta
from credo.policy.locate import check_alphabet
from credo.tasks import make_task
from credo.train.starts import resolve_checkpoint


def check_inputs(checkpoint: str, checkpoint_field: str, task: str, task_options: dict, options_prefix: str,
                 progress: bool = True, max_new_tokens: int | None = None, system_prompt: bool = True) -> str:
    """What a command reads, checked before it claims --out (as `credo train` does by building its Trainer):
    the task with its options (an unknown task or a missing jsonl file is one line naming it), the checkpoint
    (credo.train.starts.resolve_checkpoint: '' the task's SFT start, an alias, a run directory's final/), for a
    tiny policy that it can read the task's prompts, and with `max_new_tokens` that the model's context holds
    every prompt of the task (rendered with the task's system prompt unless `system_prompt` is False) and that
    many new tokens: the policy is loaded for it. Returns the checkpoint's directory."""
    built = make_task(task, task_options, prefix=options_prefix)
    path = resolve_checkpoint(checkpoint, checkpoint_field, task=task, progress=progress)
    alphabet = (read_policy_meta(path).get("tokenizer") or {}).get("alphabet")  # a tiny policy's, without loading it
    if isinstance(alphabet, str):
        check_alphabet(alphabet, built, checkpoint_field)
    if max_new_tokens is not None:
        policy = load_policy(path)  # on the CPU: only its tokenizer and context length are read
        if system_prompt:
            bind_task(policy, built, checkpoint_field, max_new_tokens)
        else:
            check_task_fits(policy, built, checkpoint_field, max_new_tokens)
    return path
