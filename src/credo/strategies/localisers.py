"""Reset localisers: which step of a failed trace is its first error? One registry, found by name.

  random  uniform over the parent's steps (RRPO);
  value   the first step whose drop in the policy's own suffix value exceeds `value_drop` (SRPO,
          ours, for models that cannot follow instructions; see `localise_by_value`);
  prompt  SRPO as its public code does it (instruction models; needs a task with
          `localisation_prompt`): the early-biasing request as a bare user turn (no system prompt),
          sampled at `prompt_temperature` (0.3) with up to `prompt_max_new_tokens` reply tokens;
          parsed by `parse_step_index` (last boxed N, else last "Step N", else step 1);
  oracle  the task's labelled first wrong step (synthetic tasks only: the credit-assignment oracle);
  self    SRPO's self-localisation (the `srpo` recipe): `prompt` where the task has a localisation
          request the policy can read (instruction models, as the paper; the tiny arith policy trained
          with localisation examples, sft preset arith-long-skilled), `value` otherwise (the earlier
          tiny starts cannot read it);
  credit  the most negative segment of any estimator's credit (`credit_method`, e.g. rredcot), the
          estimator run on the parents' batch as it is (its groups included); it is registered by the
          estimators' package (credo.credit.localiser), since strategies never import estimators.
Privileged localisers (Entry.privileged) read the task's reference solution (`value`, and `self` where it
falls back to `value`) or its step labels (`oracle`); `credit` is as privileged as its estimator.
A localiser is `fn(parents: Parents, options: LocaliserOptions) -> list[int]` (a 0-based step per
parent) registered with `@LOCALISERS.register(name, description)`; its knobs are the reset
config's (`LocaliserOptions`). `localise` calls it only for a non-empty list of parents, unless it sets
`fn.every_shard = True` (it calls a collective, which every data-parallel shard must call: `credit`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

import torch

from credo.core.config import ConfigError
from credo.core.registry import Registry
from credo.core.values import suffix_values
from credo.core.protocols import SamplingConfig
from credo.core.probe import Probe
from credo.core.rollouts import Rollouts
from credo.core.segment import segment_bounds

LOCALISERS = Registry("localiser")


@dataclass(frozen=True)
class LocaliserOptions:
    """The localisers' knobs (ResetConfig's fields of the same names): the prompt localiser's sampling
    temperature and reply budget, the value localiser's threshold on a step's value drop, and the estimator
    spec ('name' or 'name:key=value:...') whose most negative segment the credit localiser picks."""

    prompt_temperature: float = 0.3
    prompt_max_new_tokens: int = 4096
    value_drop: float = 0.05
    credit_method: str = "rredcot"


@dataclass(frozen=True)
class Parents:
    """The failed traces to localise: `rows` of `rollouts`, segment_ids[B, T] (the steps) of all of
    `rollouts`, n_steps[len(rows)], the probe (counted model access) and the run's python-side rng."""

    rollouts: Rollouts
    rows: list[int]
    segment_ids: torch.Tensor
    n_steps: list[int]
    probe: Probe
    rng: random.Random | None
    notes: dict | None = None
    """When given, what the localisers decided on the way (the audit's localisation check reads it):
    `parse_rules` (prompt: per parent 'boxed', 'prose' or 'fallback') and `resolved` (self: the localiser it ran)."""


def localise(name: str, rollouts: Rollouts, rows: Sequence[int], probe: Probe, segment_ids: torch.Tensor,
             rng: random.Random | None, prompt_temperature: float = 0.3, value_drop: float = 0.05, *,
             prompt_max_new_tokens: int = 4096, credit_method: str = "rredcot", notes: dict | None = None) -> list[int]:
    """The 0-based step to reset at for each row in `rows` (each a failed trace), by the localiser `name`
    (`notes`: see Parents)."""
    fn = LOCALISERS.get(name).fn
    # no failed trace to localise: nothing to ask or score (a policy cannot sample an empty batch), except for
    # a localiser whose work holds a collective over data-parallel shards (credit: its estimator's Probe.gather),
    # which every shard must run, also one with no row to localise
    if not rows and not getattr(fn, "every_shard", False):
        return []
    n_steps = [len(b) for b in segment_bounds(segment_ids[list(rows)])]
    parents = Parents(rollouts, list(rows), segment_ids, n_steps, probe, rng, notes)
    return fn(parents, LocaliserOptions(prompt_temperature, prompt_max_new_tokens, value_drop, credit_method))


@LOCALISERS.register("random", "uniform over the failed trace's steps (RRPO)")
def localise_randomly(parents: Parents, options: LocaliserOptions) -> list[int]:
    return [parents.rng.randrange(max(n, 1)) for n in parents.n_steps]


@LOCALISERS.register("value", "the first step whose drop in the policy's own suffix value exceeds value_drop (ours)",
                     privileged=True)  # the reference-solution tail is one of its candidates
def localise_by_value_drop(parents: Parents, options: LocaliserOptions) -> list[int]:
    return localise_by_value(parents.rollouts, parents.rows, parents.probe, parents.segment_ids, options.value_drop)


@LOCALISERS.register("prompt", "SRPO's public code: the policy is asked for the first wrong step (instruction models)")
def localise_by_prompt(parents: Parents, options: LocaliserOptions) -> list[int]:
    replies = localisation_replies(parents.rollouts, parents.rows, parents.probe, parents.segment_ids,
                                   options.prompt_temperature, options.prompt_max_new_tokens)
    parsed = [parse_step(reply, max(n, 1)) for reply, n in zip(replies, parents.n_steps)]
    if parents.notes is not None:
        parents.notes["parse_rules"] = [rule for _, rule in parsed]
    return [step for step, _ in parsed]


@LOCALISERS.register("oracle", "the task's labelled first wrong step (synthetic tasks with step labels)",
                     privileged=True)
def localise_by_oracle(parents: Parents, options: LocaliserOptions) -> list[int]:
    task = parents.probe.task
    if not getattr(task, "has_step_labels", False):
        raise ValueError("the oracle localiser needs a task with step labels (e.g. arith)")
    out = []
    for row, n in zip(parents.rows, parents.n_steps):
        first = task.step_truth(parents.rollouts.problems[row], parents.rollouts.completions[row]).first_error
        out.append(min(first if first is not None else n - 1, max(n - 1, 0)))
    return out


@LOCALISERS.register("self", "SRPO: `prompt` where the task has a localisation request the policy can read, `value` "
                     "otherwise",
                     privileged=True)  # `value` wherever the task has no localisation request
def localise_by_self(parents: Parents, options: LocaliserOptions) -> list[int]:
    resolved = "prompt" if can_ask(parents) else "value"
    if parents.notes is not None:
        parents.notes["resolved"] = resolved
    return LOCALISERS.get(resolved).fn(parents, options)


def can_ask(parents: Parents) -> bool:
    """Whether the policy can be sent the task's localisation request about these parents: the task has one,
    and a character-level policy (the tiny GPT) has every character of it in its alphabet (a start trained
    with localisation examples, sft.localisation_frac; the earlier starts do not)."""
    if getattr(parents.probe.task, "localisation_prompt", None) is None:
        return False
    requests = localisation_requests(parents.rollouts, parents.rows, parents.probe, parents.segment_ids)
    return not unreadable(parents.probe.policy, requests)


def unreadable(policy, texts: Sequence[str]) -> str:  # noqa: ANN001
    """The characters of `texts` a character-level policy's alphabet lacks ('' for a Hugging Face tokenizer,
    which encodes any text)."""
    alphabet = getattr(getattr(policy, "tokenizer", None), "alphabet", None)
    if not isinstance(alphabet, str):
        return ""
    return "".join(sorted(set("".join(texts)) - set(alphabet)))


def check_can_ask(policy, task, field: str) -> None:  # noqa: ANN001
    """Refuses, naming `field` (set to 'prompt'), a prompt localiser that could never be answered, before a run
    starts rather than at its first reset: a task without a localisation request, or a character-level policy
    whose alphabet lacks a character of the request's own wording (a start not trained with localisation
    examples; the steps quoted in it are the policy's own text, which it can read)."""
    builder = getattr(task, "localisation_prompt", None)
    if builder is None:
        raise ConfigError(f"{field}=prompt needs a task with a localisation request (localisation_prompt); task "
                          f"{getattr(task, 'name', '?')!r} has none: use value, random or oracle")
    missing = unreadable(policy, [builder(problem, ["", ""]) for problem in task.heldout_problems(1)])
    if missing:
        raise ConfigError(f"{field}=prompt needs a policy that can read the task's localisation request; this "
                          f"tiny policy's alphabet lacks {missing!r} (a start trained with localisation examples "
                          "can: sft:arith-long-skilled)")


def localisation_requests(rollouts: Rollouts, rows: Sequence[int], probe: Probe,
                          segment_ids: torch.Tensor) -> list[str]:
    """The task's localisation request about each row in `rows`: its problem and its steps (segments)."""
    builder, policy = probe.task.localisation_prompt, probe.policy
    prompts = []
    for row in rows:
        steps = [policy.decode(rollouts.completion_ids[row, a:b]) for a, b in segment_bounds(segment_ids[[row]])[0]]
        prompts.append(builder(rollouts.problems[row], steps))
    return prompts


def localise_by_value(rollouts: Rollouts, rows: Sequence[int], probe: Probe, segment_ids: torch.Tensor,
                      threshold: float) -> list[int]:
    """SRPO's `value` localiser (ours; docs/methods.md, "## RRPO and SRPO"): the first step k whose
    drop V(s_k) - V(s_{k+1}) of the policy's own normalized suffix value exceeds `threshold`; the
    final transition V(s_{K-1}) -> r is excluded; step 1 (index 0) when no drop qualifies or the
    parent has no final answer.

    Each parent is valued alone, as at training time (there is no group then): its candidates are
    its own tail after each step (utility 0, it failed) and the task's reference-solution tail
    after the same step (utility by the verifier), so V(s_k) = pi(ref | s_k) / (pi(ref | s_k) +
    pi(own | s_k)). No gold answer is forced as a candidate; the reference tail, a worked solution,
    does end with the gold answer. A task without a reference solution gives V = 0 everywhere and so
    step 1 for every parent: use `prompt` or `random` there. The normalized value and the 0.05
    default were chosen on training problems (docs/results/audit-faithful/choose_value_drop.txt:
    top-1 0.957 with step-1 share 0.504 vs the oracle's 0.475; the absolute value reaches 0.763)."""
    index = list(rows)
    alone = rollouts.select(index).with_fields(group=torch.arange(len(index), device=rollouts.group.device))
    values = suffix_values(alone, probe, segment_ids[index], mode="normalized", include_reference=True)
    return [first_value_drop(v, threshold) if probe.task.extract_answer(text) is not None else 0
            for v, text in zip(values, alone.completions)]


def first_value_drop(values: torch.Tensor, threshold: float) -> int:
    """values[K + 1] = V(s_0..s_K) -> the first k in 0..K-2 with V(s_k) - V(s_{k+1}) > threshold
    (the final transition into the outcome is excluded), else 0."""
    drops = values[:-2] - values[1:-1]
    hits = (drops > threshold).nonzero().flatten().tolist()
    return hits[0] if hits else 0


def localisation_replies(rollouts: Rollouts, rows: Sequence[int], probe: Probe, segment_ids: torch.Tensor,
                         temperature: float, max_new_tokens: int) -> list[str]:
    """The policy's own replies to the task's localisation request for each row, sent as a bare user
    turn (no system prompt: the task's answer-format instruction would contradict "reply with the
    step number"), one batched sampling call. top_p is the run's, as in the public code. A request that leaves
    no room for a reply in the context of a backend that stops there (the tiny GPT: policy.clamps_generation) is
    not sent: its reply is empty (the parser's step-1 fallback)."""
    builder = getattr(probe.task, "localisation_prompt", None)
    if builder is None:
        raise ValueError(f"the prompt localiser needs a task with localisation_prompt (chat models); "
                         f"task {getattr(probe.task, 'name', '?')!r} has none: use value, random or oracle")
    policy = probe.policy
    prompts = localisation_requests(rollouts, rows, probe, segment_ids)
    missing = unreadable(policy, prompts)
    if missing:
        raise ValueError(f"the prompt localiser needs a policy that can read the task's localisation_prompt; this "
                         f"tiny policy's alphabet lacks {missing!r} (a start trained with localisation examples "
                         "can: sft:arith-long-skilled)")
    ids, mask = policy.encode_prompts(prompts, system=False)
    # a request a backend that stops at its context cannot read whole and answer (a long trace on the tiny GPT's
    # 256 positions) gets the empty reply, which the parser reads as its step-1 fallback, as it does a truncated
    # one; the public code's models (thousands of positions) never meet this. A Hugging Face model reads on.
    context = getattr(policy, "context_length", None) if getattr(policy, "clamps_generation", False) else None
    fits = [not context or int(n) < context for n in mask.sum(dim=1)]
    replies = [""] * len(prompts)
    asked = [i for i, fit in enumerate(fits) if fit]
    if asked:
        if len(asked) < len(prompts):
            ids, mask = policy.encode_prompts([prompts[i] for i in asked], system=False)
        out = probe.sample(ids, mask, SamplingConfig(temperature, probe.sampling.top_p, max_new_tokens))
        for i, reply in zip(asked, out.completion_ids):
            replies[i] = policy.decode(reply)
    return replies


def parse_step_index(reply: str, n_steps: int) -> int:
    """0-based step from a localisation reply, as the public SRPO parser reads it (1-based there):
    the last `\\boxed{N}` when N is an integer in 1..n_steps (0 means step 1); else the last
    "Step N" / "step N" of the prose when N is in 1..n_steps; else step 1. Empty, truncated and
    number-free replies therefore reset at step 1, the early-biased fallback."""
    return parse_step(reply, n_steps)[0]


def parse_step(reply: str, n_steps: int) -> tuple[int, str]:
    """(0-based step, the rule that decided it: 'boxed', 'prose' or 'fallback'); see parse_step_index."""
    n_steps = max(n_steps, 1)
    step = _boxed_step(reply, n_steps)
    if step is not None:
        return step - 1, "boxed"
    mentions = re.findall(r"[Ss]tep\s+(\d+)", reply)
    if mentions and 1 <= int(mentions[-1]) <= n_steps:
        return int(mentions[-1]) - 1, "prose"
    return 0, "fallback"


def _boxed_step(reply: str, n_steps: int) -> int | None:
    """The 1-based step in the last brace-balanced `\\boxed{...}`, or None when absent, unbalanced
    (a truncated reply), not an integer or out of range. `\\boxed{0}` ("no error") means step 1."""
    start = reply.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    while i < len(reply) and depth:
        depth += {"{": 1, "}": -1}.get(reply[i], 0)
        i += 1
    content = reply[start + len("\\boxed{"):i - 1].strip()
    if depth or not re.fullmatch(r"[+-]?\d+", content):
        return None
    value = int(content)
    return 1 if value == 0 else value if 1 <= value <= n_steps else None
