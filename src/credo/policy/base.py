"""What every backend shares in implementing the Policy protocol (credo.core.protocols): prompt rendering and
fitting, the batched sampling loop, padding, and scoring.

A Policy turns prompts into completions (`sample`) and scores given completions (`score`,
`completion_logits`). Estimators never call a Policy directly: they go through a `Probe`
(credo.core.probe), which counts the tokens spent.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from credo.core.config import UserError
from credo.core.protocols import Policy, SamplingConfig, Samples, left_pad
from credo.core.rollouts import Prompt


def as_prompt(text: str | Prompt) -> Prompt:
    """A task's prompt as a Prompt (a plain string is the user turn)."""
    return text if isinstance(text, Prompt) else Prompt(user=text)


def render_plain(text: str | Prompt) -> str:
    """A prompt as one text for a backend without a chat template: its system part, a blank line, the user part."""
    prompt = as_prompt(text)
    return (prompt.system + "\n\n" if prompt.system else "") + prompt.user


TRUNCATION_MARK = "…"
"""Where a prompt cut to fit the model's context lost its start (fit_prompt)."""


def fit_prompt(encode: Callable[[Prompt], list[int]], prompt: Prompt, limit: int,
               mark: str = TRUNCATION_MARK) -> list[int]:
    """encode(prompt) (a prompt's token ids, template included), cut to at most `limit` tokens by dropping the
    start of its user text (marked `mark`): the end of a question usually holds what it asks. Only when the user
    asked for it (a task's `truncate_prompts`); a template that alone exceeds `limit` is a UserError."""
    return fitted_prompt(encode, prompt, limit, mark)[1]


def prompt_as_read(policy: Any, text: str | Prompt) -> Prompt:
    """The prompt `policy` reads for `text`: itself, or, where the policy cuts prompts to fit its context
    (max_prompt_tokens, a task's truncate_prompts), the cut one fit_prompt encodes (what `credo show` displays)."""
    limit = getattr(policy, "max_prompt_tokens", None)
    if limit is None:
        return as_prompt(text)
    policy.max_prompt_tokens = None  # prompt_row uncut, as the encode fit_prompt is given
    try:
        return fitted_prompt(policy.prompt_row, as_prompt(text), limit,
                             getattr(policy, "truncation_mark", TRUNCATION_MARK))[0]
    finally:
        policy.max_prompt_tokens = limit


def fitted_prompt(encode: Callable[[Prompt], list[int]], prompt: Prompt, limit: int,
                  mark: str = TRUNCATION_MARK) -> tuple[Prompt, list[int]]:
    """(the prompt fit_prompt keeps, its ids): `prompt` itself when it fits."""
    ids = encode(prompt)
    if len(ids) <= limit:
        return prompt, ids
    user = prompt.user

    def cut(drop: int) -> list[int]:
        return encode(kept(drop))

    def kept(drop: int) -> Prompt:
        return Prompt(mark + user[drop:], prompt.system)

    if len(cut(len(user))) > limit:
        raise UserError(f"a prompt's template alone is {len(cut(len(user)))} tokens, over the {limit} the model's "
                        "context leaves for it; truncation cannot make it fit (lower max_new_tokens)")
    low, high = 0, len(user)  # the fewest characters dropped that fit: cut(high) fits, cut(low) may not
    while low < high:
        middle = (low + high) // 2
        if len(cut(middle)) <= limit:
            high = middle
        else:
            low = middle + 1
    return kept(high), cut(high)


def strip_eos(ids: Sequence[int], eos_id: int) -> list[int]:
    """A completion's ids without its trailing EOS (unchanged when it stopped without one)."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] == eos_id else ids


def right_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu",
              min_width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Lists of ids -> (ids[B, L] right-padded, mask[B, L] bool); L >= min_width."""
    width = max([len(r) for r in rows] + [min_width])
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = True
    return ids.to(device), mask.to(device)


def pick_tokens(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """logits[B, V] (banned tokens already at -inf) -> sampled token ids [B]."""
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    # x / 1.0 == x exactly: the division is skipped, not approximated
    probs = F.softmax(logits if sampling.temperature == 1.0 else logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < sampling.top_p  # always keeps the top token
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    if generator.device != probs.device:  # a CPU generator while the model runs on a GPU (TRL, verl)
        return sample_by_inverse_cdf(probs, generator)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def sample_by_inverse_cdf(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """probs[B, V] (unnormalised rows allowed, e.g. after top-p) on any device -> token ids [B], drawing one
    uniform per row from `generator` on its own device: the first token whose cumulative probability exceeds
    it. The distribution of torch.multinomial (another random stream), which refuses a generator on another
    device; only B numbers cross devices, and the run stays seeded by credo's CPU generator."""
    # float64: a GPU's parallel scan need not be monotone in float32 where its blocks meet
    cdf = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=generator.device, dtype=torch.float64)
    u = u.to(probs.device) * cdf[:, -1:]
    # right=True: u must be below a token's upper edge, so a zero-probability token (a flat step) is never drawn
    token = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=probs.shape[1] - 1)
    # where rounding still lands on a zero-probability token (u at the very top), the most likely one instead
    drawn_zero = probs.gather(1, token[:, None]).squeeze(1) <= 0
    return torch.where(drawn_zero, probs.argmax(-1), token)


def generate(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prompt_ids: torch.Tensor,
             prompt_mask: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator, *,
             eos_id: int, pad_id: int, banned_ids: Sequence[int] = ()) -> Samples:
    """Batched autoregressive sampling with a stateful `step(ids[B, L], mask[B, L]) -> last logits[B, V]`
    (the backend keeps its KV cache inside `step`). Rows stop at EOS; the loop stops when all have.
    Tokens and log-probs go into preallocated [B, max_new_tokens] buffers (no per-token list or stack)."""
    B, steps = prompt_ids.shape[0], sampling.max_new_tokens
    device = prompt_ids.device
    tokens = torch.empty(B, steps, dtype=torch.long, device=device)
    logps = torch.empty(B, steps, device=device)
    banned = torch.tensor(list(banned_ids), dtype=torch.long, device=device) if banned_ids else None
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    made = 0
    logits = step(prompt_ids, prompt_mask)
    while made < steps:
        logits = logits.float()
        raw_logp = F.log_softmax(logits, dim=-1)
        if banned is not None:
            logits.index_fill_(1, banned, float("-inf"))
        token = pick_tokens(logits, sampling, generator).masked_fill(finished, pad_id)
        tokens[:, made] = token
        logps[:, made] = raw_logp.gather(1, token[:, None]).squeeze(1).masked_fill(finished, 0.0)
        made += 1
        live = ~finished
        finished = finished | (token == eos_id)
        if bool(finished.all()):
            break
        logits = step(token[:, None], live[:, None])
    completion_ids = tokens[:, :made]
    # a token is real if the row had not finished before it (the EOS itself is real)
    done_before = torch.cat([torch.zeros(B, 1, dtype=torch.bool, device=device),
                             (completion_ids == eos_id).cumsum(1)[:, :-1] > 0], 1)[:, :made]
    completion_mask = ~done_before
    completion_ids = completion_ids.masked_fill(~completion_mask, pad_id)
    return Samples(completion_ids, completion_mask, logps[:, :made] * completion_mask)


# A batch's memory bounded by its longest row: left padding makes every row as long as the longest prompt, so a
# few long questions among many short ones multiply the KV cache of the whole batch (rows x longest prompt).
# A backend runs a batch over its budget as consecutive sub-batches, each padded only to its own longest prompt;
# a batch within it is one chunk and runs exactly as before.

def row_chunks(prompt_mask: torch.Tensor, new_tokens: int, budget: int) -> list[torch.Tensor]:
    """Row indices of consecutive sub-batches of prompt_mask[B, P] (True = a real prompt token), each with
    rows x (its longest prompt + new_tokens) <= budget, or a single row when one row alone is over it.
    One chunk (every row) when the whole padded batch, B x (P + new_tokens), is within the budget."""
    rows = prompt_mask.shape[0]
    if rows * (prompt_mask.shape[1] + new_tokens) <= budget:
        return [torch.arange(rows)]
    lengths = prompt_mask.sum(1).tolist()
    chunks, start, longest = [], 0, 0
    for row, length in enumerate(lengths):
        wider = max(longest, int(length))
        if row > start and (row - start + 1) * (wider + new_tokens) > budget:
            chunks.append(torch.arange(start, row))
            start, wider = row, int(length)
        longest = wider
    chunks.append(torch.arange(start, rows))
    return chunks


def distinct_prompts(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(ids[U, P], mask[U, P], rows[B]) of the U < B distinct left-padded prompts of ids[B, P], rows[i] naming row
    i's prompt; None when every row's prompt differs (what a backend's `shared_prompt_logits` reads once)."""
    unique, rows = torch.unique(torch.cat([ids, mask.long()], 1), dim=0, return_inverse=True)
    if unique.shape[0] == ids.shape[0]:
        return None
    return unique[:, :ids.shape[1]], unique[:, ids.shape[1]:].bool(), rows


def trim_left_padding(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids[b, P], mask[b, P] (left-padded) without the leading columns that are padding in every row."""
    real = mask.any(0).nonzero()
    first = int(real[0]) if real.numel() else mask.shape[1]
    return ids[:, first:], mask[:, first:]


def stitch_samples(parts: Sequence[Samples], pad_id: int) -> Samples:
    """Sub-batches' Samples in order, as one: each right-padded (pad_id, mask False, log-prob 0) to the widest."""
    width = max(p.completion_ids.shape[1] for p in parts)

    def widen(t: torch.Tensor, fill: float | int | bool) -> torch.Tensor:
        return F.pad(t, (0, width - t.shape[1]), value=fill)

    return Samples(torch.cat([widen(p.completion_ids, pad_id) for p in parts]),
                   torch.cat([widen(p.completion_mask, False) for p in parts]),
                   torch.cat([widen(p.logprobs, 0.0) for p in parts]))


class CompletionScoring:
    """`completion_logits` and `score` of a backend, from its one full forward `forward_logits`."""

    def forward_logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids[B, L] (left-padded prompt + right-padded completion), mask[B, L] -> logits[B, L, V]."""
        raise NotImplementedError

    def completion_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                          completion_mask: torch.Tensor) -> torch.Tensor:
        """logits[B, T, V] predicting each completion token (grad follows torch.is_grad_enabled)."""
        P, T = prompt_ids.shape[1], completion_ids.shape[1]
        logits = self.forward_logits(torch.cat([prompt_ids, completion_ids], 1),
                                     torch.cat([prompt_mask, completion_mask], 1))
        return logits[:, P - 1:P + T - 1]

    def score(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
              completion_mask: torch.Tensor, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logprobs[B, T], entropy[B, T] | None) of the given completions, zero on padding."""
        logits = self.completion_logits(prompt_ids, prompt_mask, completion_ids, completion_mask)
        return gather_logprobs(logits, completion_ids, completion_mask, entropy)


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor,
                    entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits[B, T, V] predicting tokens[B, T] -> (logprobs[B, T], entropy[B, T] | None), zero where ~mask."""
    logp_all = F.log_softmax(logits.float(), dim=-1)
    logprobs = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * mask
    ent = None
    if entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logprobs, ent


def score_branches_by_rescoring(policy: "Policy", prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                                completion_ids: torch.Tensor, branches: Sequence[tuple[int, int, Sequence[int]]],
                                chunk: int = 256) -> tuple[list[torch.Tensor], int]:
    """Branch scoring without prefix reuse: each (row, cut, tokens) branch re-reads prompt + completion[:cut].
    Returns (per-branch log-probs, tokens forwarded)."""
    out: list[torch.Tensor] = []
    forwarded = 0
    for start in range(0, len(branches), chunk):
        part = branches[start:start + chunk]
        prefixes = [prompt_ids[r][prompt_mask[r]].tolist() + completion_ids[r, :c].tolist() for r, c, _ in part]
        p_ids, p_mask = left_pad(prefixes, policy.pad_id, prompt_ids.device)
        b_ids, b_mask = right_pad([list(t) for _, _, t in part], policy.pad_id, prompt_ids.device)
        logprobs, _ = policy.score(p_ids, p_mask, b_ids, b_mask)
        out.extend(logprobs[i, :len(t)] for i, (_, _, t) in enumerate(part))
        forwarded += int(p_mask.sum() + b_mask.sum())
    return out, forwarded


def read_policy_meta(path: str) -> dict:
    """The checkpoint's policy.json ({} when it has none); a corrupt one is an error naming the file."""
    meta_path = os.path.join(path, "policy.json")
    if not os.path.exists(meta_path):
        return {}
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{meta_path} is not valid JSON ({err}); the checkpoint is corrupt") from None
    if not isinstance(meta, dict):
        raise UserError(f"{meta_path} must hold a JSON object, got {type(meta).__name__}; the checkpoint is corrupt")
    return meta
