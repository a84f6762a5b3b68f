"""Hugging Face backend: any `AutoModelForCausalLM` behind the Policy interface (fp32 on CPU; with `autocast`,
fp32 weights whose matrix products run in bfloat16: credo.policy.device's bfloat16-mixed).

Prompts are left-padded and completions right-padded, as in the tiny backend; positions come from
the attention mask, so padded rows match unpadded ones. Sampling runs the shared loop of
credo.policy.base with the model's own KV cache. With `chat=True` prompts are wrapped in the
tokenizer's chat template (a system prompt when the task gives one). Branch scoring re-reads
each prefix (no tree attention through HF models), and reports that cost honestly.
LoRA adapters come from peft (credo.policy.adapters): only they then train, and a save holds them alone.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from typing import Iterator, Sequence

import torch

from credo.core.config import UserError
from credo.core.protocols import Samples, SamplingConfig, left_pad
from credo.policy.base import (CompletionScoring, as_prompt, distinct_prompts, fit_prompt, generate, render_plain,
                               read_policy_meta, right_pad, row_chunks, score_branches_by_rescoring, stitch_samples,
                               trim_left_padding)
from credo.core.rollouts import Prompt
from credo.core.files import atomic_directory
from credo.core.state_io import CorruptStateError
from credo.policy.adapters import (LoraSettings, adapter_meta, is_lora, load_adapter_weights, save_adapter,
                                   wrap_with_lora)
from credo.policy.device import dtype_argument
from credo.policy.hf_folder import refuse_custom_code, refuse_pickled_weights


MAX_BATCH_TOKENS = 65_536
"""Padded tokens (rows x (longest prompt + new tokens)) one sampling or gradient-free scoring pass may hold; a
batch over it runs as consecutive sub-batches, each padded to its own longest row. ~3 GB of KV cache for
SmolLM2-135M (46 KB a token); every batch of credo's SmolLM2 recipes stays under it (so runs as before). Three
15,000-character questions among 24 prompts x 8 samples made one pass of ~190 rows x ~4,100 tokens (16.7 GB)."""


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' 'Loading weights' bar off while a local model loads: an error after it stays one line."""
    from transformers.utils import logging as hf_logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class HFPolicy(CompletionScoring):
    """A transformers causal LM + tokenizer with the interface of credo.core.protocols.Policy."""

    def __init__(self, model: torch.nn.Module, tokenizer: object, device: str | torch.device = "cpu",
                 chat: bool | None = None, system_prompt: str | None = None, cast: bool = True,
                 dtype: torch.dtype = torch.float32, autocast: torch.dtype | None = None) -> None:
        self.device = torch.device(device)
        self.autocast = autocast  # every forward under torch.autocast(dtype=autocast) when set (_forward)
        # float32, or bfloat16 on a GPU (credo.policy.device); a wrapped model (cast=False) keeps its own
        self.dtype = dtype if cast else getattr(model, "dtype", dtype)
        # cast=False wraps a model owned by someone else (a TRL trainer) without touching its dtype/device
        self.model = model.to(self.device).to(dtype) if cast else model
        self.tokenizer = tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.chat = has_template if chat is None else (chat and has_template)
        self.system_prompt = system_prompt
        self.banned_ids: list[int] = []
        self.max_prompt_tokens: int | None = None  # set: prompts are cut to fit (a task's truncate_prompts)
        self.max_batch_tokens = MAX_BATCH_TOKENS
        # score rows that share a prompt by reading it once (shared_prompt_logits); False: every row in full
        self.share_prompts = True
        # a LoRA policy's base: (its name as given, the sha256 of its weights), written beside the adapter on save
        self.adapter_base: tuple[str, str] | None = None

    # --- construction -----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str, device: str | torch.device = "cpu", chat: bool | None = None,
                        dtype: torch.dtype = torch.float32, autocast: torch.dtype | None = None) -> "HFPolicy":
        from transformers import AutoModelForCausalLM, AutoTokenizer
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
        refuse_pickled_weights(path)
        refuse_custom_code(path)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        with quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(path, **dtype_argument(dtype), trust_remote_code=False)
        return cls(model, tokenizer, device, chat, dtype=dtype, autocast=autocast)

    def add_lora(self, settings: LoraSettings, seed: int = 0, base: tuple[str, str] | None = None) -> None:
        """Wrap the model with fresh peft LoRA adapters (credo.policy.adapters.wrap_with_lora: initial weights
        from `seed`); only they keep requires_grad. `base`: (name, weights digest) of the model under them, which
        a save records."""
        self.model = wrap_with_lora(self.model, settings, seed)
        self.adapter_base = base

    def merge_adapter(self) -> None:
        """Fold the adapters into the weights they modify (peft's merge_and_unload): a plain model again."""
        if is_lora(self.model):
            self.model = self.model.merge_and_unload()
            self.adapter_base = None
            for p in self.model.parameters():  # peft froze the base: trainable again, as a freshly loaded model
                p.requires_grad_(True)

    # --- text <-> tensors -------------------------------------------------------------------------
    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def format_prompt(self, text: str | Prompt, system: bool = True) -> str:
        """Chat template: the bound task system prompt, then the prompt's own system part (SC-GRPO's
        reference solution), as the system message; the user part as the user turn. system=False: no
        task system prompt (SRPO's localisation request is a bare user turn, as its public code sends it).
        Without a chat template: credo.policy.base.render_plain."""
        if not self.chat:
            return render_plain(text)
        prompt = as_prompt(text)
        system_text = "\n\n".join(x for x in ((self.system_prompt if system else None), prompt.system) if x)
        messages = (([{"role": "system", "content": system_text}] if system_text else [])
                    + [{"role": "user", "content": prompt.user}])
        from jinja2.exceptions import TemplateError  # transformers' chat templates are jinja2, sandboxed
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except TemplateError as err:  # a template that tries to leave the sandbox, or is broken: the model's file
            first = " ".join(str(err).split())[:200]
            raise UserError(f"the chat template of {getattr(self.tokenizer, 'name_or_path', '') or 'the model'} "
                            f"cannot be rendered ({type(err).__name__}: {first}); credo runs it sandboxed and "
                            "refuses it; fix or remove the model's chat_template") from None

    @property
    def context_length(self) -> int | None:
        """Positions the model can read (its config's max_position_embeddings or n_positions; None: unknown)."""
        config = getattr(self.model, "config", None)
        for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    def prompt_row(self, text: str | Prompt, system: bool = True) -> list[int]:
        """A prompt's token ids, template included; cut to max_prompt_tokens when that is set (fit_prompt)."""
        def encode(prompt: str | Prompt) -> list[int]:
            text = self.format_prompt(prompt, system)
            return list(self.tokenizer(text, add_special_tokens=not self.chat)["input_ids"])
        if self.max_prompt_tokens is None:
            return encode(text)
        return fit_prompt(encode, as_prompt(text), self.max_prompt_tokens)

    def encode_prompts(self, texts: Sequence[str | Prompt], system: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        # a task's prompts were checked against the context (credo.policy.locate.check_context); prompts built at
        # run time (SRPO's localisation request around a completion) may pass it: a RoPE model reads on, degraded
        return left_pad([self.prompt_row(t, system) for t in texts], self.pad_id, self.device)

    def encode_continuation(self, text: str, eos: bool = False) -> list[int]:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return ids + ([self.eos_id] if eos else [])

    def encode_completions(self, texts: Sequence[str], eos: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        return right_pad([self.encode_continuation(t, eos) for t in texts], self.pad_id, self.device)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return ["" if int(i) in (self.eos_id, self.pad_id) else self.tokenizer.decode([int(i)]) for i in ids]

    # --- model calls --------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        """torch.autocast in `autocast` (no-op without it). Inside one such context each weight is cast once
        and reused: sampling enters it around the whole token loop, not per token (~135M casts a token)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def _forward(self, **inputs: object) -> object:
        """self.model(**inputs); with `autocast`, under torch.autocast so that the matrix products run in that
        dtype while the weights (and the gradients and AdamW state they give) stay in theirs, and with the
        logits[B, L, V] returned in float32 (a log-softmax over bfloat16 logits would lose ~2 decimal digits)."""
        if self.autocast is None:
            return self.model(**inputs)
        with self._autocast():
            out = self.model(**inputs)
        out.logits = out.logits.float()
        return out

    @staticmethod
    def _positions(mask: torch.Tensor, offset: torch.Tensor | int = 0) -> torch.Tensor:
        return (offset + mask.long().cumsum(1) - 1).clamp(min=0)

    @torch.no_grad()
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator) -> Samples:
        """Completions of prompt_ids[B, P]; a batch over max_batch_tokens runs as sub-batches (row_chunks),
        one after another from the same generator (so the same seed gives the same samples)."""
        chunks = row_chunks(prompt_mask, sampling.max_new_tokens, self.max_batch_tokens)
        if len(chunks) == 1:
            return self._sample_batch(prompt_ids, prompt_mask, sampling, generator)
        parts = [self._sample_batch(*trim_left_padding(prompt_ids[rows], prompt_mask[rows]), sampling, generator)
                 for rows in chunks]
        return stitch_samples(parts, self.pad_id)

    def _sample_batch(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingConfig,
                      generator: torch.Generator) -> Samples:
        from credo.policy.hf_cache import preallocated_cache  # it imports transformers: when a HF model samples
        was_training = self.model.training
        self.model.eval()
        # keys/values written in place, not concatenated per token (hf_cache); same numbers as DynamicCache
        cache = preallocated_cache(prompt_ids.shape[1] + sampling.max_new_tokens)
        state = {"cache": cache, "mask": None,
                 "next": torch.zeros(prompt_ids.shape[0], dtype=torch.long, device=prompt_ids.device)}

        def step(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            first = state["mask"] is None
            full = mask if first else torch.cat([state["mask"], mask], 1)
            distinct = self.distinct_prompts(ids, mask) if first else None  # the prompt call: each prompt once
            rows = None
            if distinct is not None:
                ids, mask, rows = distinct
            positions = self._positions(mask, 0 if first else state["next"][:, None])
            # logits of the last position only: the prompt's first call would otherwise run the LM head over
            # every prompt position (a 49k vocabulary x ~100 chat-prompt tokens per row for SmolLM2)
            out = self._forward(input_ids=ids, attention_mask=mask.long() if rows is not None else full.long(),
                             position_ids=positions, cache=state["cache"], use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1]
            if rows is not None:
                out.cache.batch_select_indices(rows)
                logits, mask = logits[rows], mask[rows]
            state["cache"], state["mask"] = out.cache, full
            state["next"] = state["next"] + mask.long().sum(1)
            return logits

        with self._autocast():
            result = generate(step, prompt_ids, prompt_mask, sampling, generator, eos_id=self.eos_id,
                              pad_id=self.pad_id, banned_ids=self.banned_ids)
        self.model.train(was_training)
        return result

    def score(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
              completion_mask: torch.Tensor, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """CompletionScoring.score; without a gradient, a batch over max_batch_tokens is scored in sub-batches
        (row_chunks; with a gradient every row's graph is kept anyway, so the batch stays whole)."""
        chunks = row_chunks(prompt_mask, completion_ids.shape[1], self.max_batch_tokens)
        if len(chunks) == 1 or torch.is_grad_enabled():
            return super().score(prompt_ids, prompt_mask, completion_ids, completion_mask, entropy)
        parts = [super(HFPolicy, self).score(*trim_left_padding(prompt_ids[rows], prompt_mask[rows]),
                                             completion_ids[rows], completion_mask[rows], entropy) for rows in chunks]
        logprobs = torch.cat([p[0] for p in parts])
        return logprobs, (torch.cat([p[1] for p in parts]) if entropy else None)

    def forward_logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self._forward(input_ids=ids, attention_mask=mask.long(), position_ids=self._positions(mask)).logits

    def completion_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                          completion_mask: torch.Tensor) -> torch.Tensor:
        """logits[B, T, V] predicting each completion token. Only the last T + 1 positions go through the LM
        head (transformers' `logits_to_keep`, as TRL scores): with a ~100-token chat prompt and SmolLM2's
        49k-word vocabulary, the head over every prompt position was ~40% of a training step on a CPU.
        Rows that share their prompt (a GRPO group) read it once: see `shared_prompt_logits`."""
        shared = self.shared_prompt_logits(prompt_ids, prompt_mask, completion_ids, completion_mask)
        if shared is not None:
            return shared
        T = completion_ids.shape[1]
        ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
        out = self._forward(input_ids=ids, attention_mask=mask.long(), position_ids=self._positions(mask),
                            logits_to_keep=T + 1)
        return out.logits[:, -(T + 1):-1]

    @property
    def checkpointing(self) -> bool:
        """Activation checkpointing is on: transformers then turns the KV cache off."""
        return bool(getattr(self.model, "is_activation_checkpointing", False))

    def distinct_prompts(self, ids: torch.Tensor,
                         mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(ids[U, P], mask[U, P], rows[B]) of the U < B distinct left-padded prompts of ids[B, P], rows[i]
        naming row i's prompt; None when prompt sharing is off or every row's prompt differs."""
        return distinct_prompts(ids, mask) if self.share_prompts else None

    def shared_prompt_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                             completion_mask: torch.Tensor) -> torch.Tensor | None:
        """completion_logits for a batch whose B rows hold U < B distinct prompts (None when every prompt
        differs). The U prompts run through the model once, their KV cache is gathered to the B rows
        (differentiable: each prompt's gradient is the sum over its rows), and the completions run on top.
        The same logits as the full forward up to float rounding (tests/test_hf.py); for 2 prompts x 4
        completions of SmolLM2 it reads ~half the tokens of the full forward."""
        from transformers import DynamicCache
        T = completion_ids.shape[1]
        if self.checkpointing:  # transformers turns the KV cache off: nothing to share
            return None
        distinct = self.distinct_prompts(prompt_ids, prompt_mask)
        if distinct is None or T == 0:
            return None
        unique_ids, unique_mask, inverse = distinct
        out = self._forward(input_ids=unique_ids, attention_mask=unique_mask.long(),
                            position_ids=self._positions(unique_mask),
                            cache=DynamicCache(), use_cache=True, logits_to_keep=1)
        cache = out.cache
        if cache is None:  # a model without a KV cache: read every row in full
            return None
        cache.batch_select_indices(inverse)
        first = out.logits[:, -1][inverse]  # (B, V): predicts each row's first completion token
        mask = torch.cat([prompt_mask, completion_mask], 1)
        positions = self._positions(completion_mask, prompt_mask.long().sum(1, keepdim=True))
        rest = self._forward(input_ids=completion_ids, attention_mask=mask.long(), position_ids=positions, cache=cache,
                             use_cache=True, logits_to_keep=T).logits  # (B, T, V): predicts tokens 2 .. T + 1
        return torch.cat([first[:, None], rest[:, :-1]], 1)

    @torch.no_grad()
    def score_branches(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                       completion_mask: torch.Tensor, branches: Sequence[tuple[int, int, Sequence[int]]],
                       reuse_prefix: bool = True) -> tuple[list[torch.Tensor], int]:
        """Same contract as TinyPolicy.score_branches; every branch re-reads its prefix here."""
        return score_branches_by_rescoring(self, prompt_ids, prompt_mask, completion_ids, branches, chunk=64)

    # --- persistence --------------------------------------------------------------------------------
    def save(self, directory: str) -> None:
        with atomic_directory(directory) as tmp:
            self.save_into(tmp)

    def save_into(self, directory: str) -> None:
        """The policy into `directory`: a LoRA policy as its adapter alone, with policy.json naming its base and
        the base's weights digest (credo.policy.adapters); any other as full weights with its tokenizer."""
        os.makedirs(directory, exist_ok=True)
        meta = {"backend": "hf", "chat": self.chat, "system_prompt": self.system_prompt}
        if is_lora(self.model):
            if self.adapter_base is None:
                raise ValueError("a LoRA policy saved without its base named: build it with add_lora(base=...)")
            save_adapter(self.model, directory)
            meta["adapter"] = {"base": self.adapter_base[0], "base_digest": self.adapter_base[1]}
        else:
            self.model.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)
        with open(os.path.join(directory, "policy.json"), "w") as f:
            json.dump(meta, f, indent=2)

    def load_weights_from(self, directory: str) -> None:
        """Restore trainable weights saved by save_into (the adapter of a LoRA policy, after checking that the
        checkpoint was trained on this policy's base)."""
        if is_lora(self.model):
            meta = adapter_meta(directory)
            if meta is None:
                raise CorruptStateError(f"{directory} holds full weights, not the LoRA adapter this run trains")
            base = self.adapter_base
            if base is not None and meta["base_digest"] != base[1]:
                raise CorruptStateError(f"{os.path.join(directory, 'policy.json')}: the checkpoint's adapter was "
                                        f"trained on base {meta['base']} ({meta['base_digest'][:19]}...), but this "
                                        f"run's start {base[0]} has weights {base[1][:19]}...")
            load_adapter_weights(self.model, directory)
            return
        self.model.load_state_dict(HFPolicy.load(directory, dtype=self.dtype).model.state_dict())

    @classmethod
    def load(cls, directory: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
             autocast: torch.dtype | None = None) -> "HFPolicy":
        meta = read_policy_meta(directory)
        policy = cls.from_pretrained(directory, device, meta.get("chat"), dtype=dtype, autocast=autocast)
        policy.system_prompt = meta.get("system_prompt")
        return policy

    def copy(self) -> "HFPolicy":
        clone = HFPolicy(copy.deepcopy(self.model), self.tokenizer, self.device, self.chat, self.system_prompt,
                         dtype=self.dtype, autocast=self.autocast)
        clone.banned_ids = list(self.banned_ids)
        clone.max_prompt_tokens, clone.max_batch_tokens = self.max_prompt_tokens, self.max_batch_tokens
        clone.adapter_base = self.adapter_base
        return clone
