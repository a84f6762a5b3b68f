"""The tiny policy backend: our GPT + a character tokenizer, saved as safetensors + JSON."""

from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import torch
from safetensors.torch import load_file, save_file

from credo.core.protocols import Samples, SamplingConfig, left_pad
from credo.policy.base import (CompletionScoring, as_prompt, distinct_prompts, fit_prompt, generate, render_plain,
                               right_pad, read_policy_meta, score_branches_by_rescoring)
from credo.policy.branches import score_packed_branches
from credo.policy.gpt import GPT, GPTConfig, KVCache
from credo.policy.tokenizer import CharTokenizer
from credo.core.rollouts import Prompt
from credo.core.files import atomic_directory


def cached_step(model: GPT, cache: KVCache) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """`generate`'s step over `cache`: the prompt (ids[B, P], mask[B, P]) by the full forward, then each
    generated token (ids[B, 1]) by the lean `GPT.decode_step` (same numbers) -> last logits[B, V]."""

    def step(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] == 1 and cache.length:
            return model.decode_step(ids[:, 0], mask[:, 0], cache)
        return model(ids, mask, cache)[:, -1]

    return step


class TinyPolicy(CompletionScoring):
    """A GPT of our own with a character tokenizer. Sampling uses a preallocated KV cache."""

    system_prompt: str | None = None  # no system turn: a bound task system prompt is not rendered
    max_prompt_tokens: int | None = None  # set: prompts are cut to fit (a task's truncate_prompts)
    truncation_mark = ""  # where a cut prompt lost its start: none, since '…' is not in its alphabet
    clamps_generation = True  # `sample` stops at model.max_len: a prompt needs room for one new token only

    def __init__(self, model: GPT, tokenizer: CharTokenizer, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.share_prompts = True  # scoring reads rows that share a prompt once (shared_prompt_logits)

    @classmethod
    def create(cls, config: GPTConfig, tokenizer: CharTokenizer, seed: int = 0, device: str = "cpu") -> "TinyPolicy":
        if config.vocab_size != tokenizer.vocab_size:
            raise ValueError(f"model.vocab_size={config.vocab_size} "
                             f"but the tokenizer has {tokenizer.vocab_size} tokens")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = GPT(config)
        return cls(model, tokenizer, device)

    # --- text <-> tensors -------------------------------------------------------------------------
    def encode_prompts(self, texts: Sequence[str | Prompt], system: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts -> (ids[B, P] left-padded with BOS first, mask[B, P]), each rendered as plain text.
        `system` and `system_prompt` are unused: the tiny model has no system turn."""
        return left_pad([self.prompt_row(t) for t in texts], self.tokenizer.pad_id, self.device)

    def prompt_row(self, text: str | Prompt, system: bool = True) -> list[int]:
        """A prompt's token ids (BOS first); cut to max_prompt_tokens when that is set (fit_prompt)."""
        def encode(prompt: str | Prompt) -> list[int]:
            return self.tokenizer.encode(render_plain(prompt), bos=True)
        if self.max_prompt_tokens is None:
            return encode(text)
        return fit_prompt(encode, as_prompt(text), self.max_prompt_tokens, mark=self.truncation_mark)

    @property
    def context_length(self) -> int:
        """Positions the model reads (model.max_len)."""
        return self.model.config.max_len

    def encode_completions(self, texts: Sequence[str], eos: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        return right_pad([self.tokenizer.encode(t, eos=eos) for t in texts], self.tokenizer.pad_id, self.device)

    def decode(self, ids: torch.Tensor) -> str:
        return self.tokenizer.decode(ids)

    def encode_continuation(self, text: str, eos: bool = False) -> list[int]:
        """Token ids of `text` appended to an existing sequence (no BOS)."""
        return self.tokenizer.encode(text, eos=eos)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Text of each token (EOS and PAD as '') so segmenters can find delimiters."""
        return [self.tokenizer.id_to_char.get(int(i), "") for i in ids]

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id

    # --- sampling and scoring ---------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator) -> Samples:
        was_training = self.model.training
        self.model.eval()
        budget = min(sampling.max_new_tokens, self.model.config.max_len - prompt_ids.shape[1])
        if budget < sampling.max_new_tokens:
            sampling = SamplingConfig(sampling.temperature, sampling.top_p, max(budget, 0))
        cache = self.model.new_cache(prompt_ids.shape[0], prompt_ids.shape[1] + sampling.max_new_tokens)
        out = generate(cached_step(self.model, cache), prompt_ids, prompt_mask, sampling, generator, eos_id=self.eos_id,
                       pad_id=self.pad_id, banned_ids=self.tokenizer.banned_ids)
        self.model.train(was_training)
        return out

    def forward_logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, mask)

    @torch.no_grad()
    def shared_prompt_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                             completion_mask: torch.Tensor) -> torch.Tensor | None:
        """completion_logits[B, T, V] for a batch whose B rows hold U < B distinct left-padded prompts (None when
        every prompt differs): the U prompts run through the model once into a KV cache, gathered to the B rows,
        and the completions run on top. The same logits as the full forward up to float rounding
        (tests/test_sc_grpo_speed.py); SC-GRPO's teacher contexts (a verified solution, then the problem: ~60% of
        a teacher row on arith-long) are shared by a group's rows. No gradient: scoring only (credo.core.probe)."""
        distinct = distinct_prompts(prompt_ids, prompt_mask) if self.share_prompts else None
        (B, P), T = prompt_ids.shape, completion_ids.shape[1]
        if distinct is None or T == 0:
            return None
        unique_ids, unique_mask, inverse = distinct
        cache = self.model.new_cache(unique_ids.shape[0], P)
        first = self.model(unique_ids, unique_mask, cache)[:, -1]  # [U, V]: predicts each first completion token
        rows = self.model.new_cache(B, P + T)
        rows.k[:, :, :, :P] = cache.k[:, inverse]
        rows.v[:, :, :, :P] = cache.v[:, inverse]
        rows.key_mask[:, :P] = cache.key_mask[inverse, :P]
        rows.next_position = cache.next_position[inverse].clone()
        rows.length = P
        rest = self.model(completion_ids, completion_mask, rows)  # [B, T, V]: predicts tokens 2 .. T + 1
        return torch.cat([first[inverse][:, None], rest[:, :-1]], 1)

    @torch.no_grad()
    def score_branches(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                       completion_mask: torch.Tensor, branches: Sequence[tuple[int, int, Sequence[int]]],
                       reuse_prefix: bool = True) -> tuple[list[torch.Tensor], int]:
        """Log-probs of token branches grafted onto completion prefixes.

        branches: (row, cut, tokens): `tokens` teacher-forced after prompt + completion[row, :cut].
        Returns (per branch, logprobs[len(tokens)]; tokens forwarded). With reuse_prefix each row's
        prompt + completion is forwarded once into a KV cache and the branches are scored in one packed
        tree-attention pass (credo.policy.branches; cost T + sum |branch|); without it every branch re-reads
        its prefix (cost sum (prefix + |branch|)).
        """
        if not branches:
            return [], 0
        if not reuse_prefix:
            return score_branches_by_rescoring(self, prompt_ids, prompt_mask, completion_ids, branches)
        rows = sorted({r for r, _, _ in branches})
        row_index = {r: i for i, r in enumerate(rows)}
        seq = torch.cat([prompt_ids[rows], completion_ids[rows]], 1)
        mask = torch.cat([prompt_mask[rows], completion_mask[rows]], 1)
        out = score_packed_branches(self.model, seq, mask, prompt_ids.shape[1],
                                    [(row_index[r], c, t) for r, c, t in branches], self.pad_id)
        forwarded = int(mask.sum()) + sum(len(t) for _, _, t in branches)
        return out, forwarded

    # --- persistence --------------------------------------------------------------------------------
    def save(self, directory: str) -> None:
        with atomic_directory(directory) as tmp:
            self.save_into(tmp)

    def save_into(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        save_file(state, os.path.join(directory, "model.safetensors"))
        meta = {"backend": "tiny", "model": vars(self.model.config), "tokenizer": self.tokenizer.state()}
        with open(os.path.join(directory, "policy.json"), "w") as f:
            json.dump(meta, f, indent=2)

    @classmethod
    def load(cls, directory: str, device: str = "cpu") -> "TinyPolicy":
        if not os.path.exists(os.path.join(directory, "policy.json")):
            raise FileNotFoundError(f"{directory} is not a credo tiny-policy checkpoint (no policy.json)")
        meta = read_policy_meta(directory)
        model = GPT(GPTConfig(**meta["model"]))
        model.load_state_dict(load_file(os.path.join(directory, "model.safetensors")))
        return cls(model, CharTokenizer.from_state(meta["tokenizer"]), device)

    def load_weights_from(self, directory: str) -> None:
        self.model.load_state_dict(load_file(os.path.join(directory, "model.safetensors")))

    def copy(self) -> "TinyPolicy":
        clone = GPT(self.model.config).to(self.device)
        clone.load_state_dict(self.model.state_dict())
        copied = TinyPolicy(clone, self.tokenizer, self.device)
        copied.max_prompt_tokens = self.max_prompt_tokens
        return copied
