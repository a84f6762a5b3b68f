"""The Probe: the only door through which an estimator may use the model, and its cost meter.

It scores given token sequences, returns next-token distributions, and samples continuations
from prefixes. Everything runs without gradient, and every token
forwarded or generated is counted, so each Credit can report what it cost.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch

from credo.core.protocols import Policy, Samples, SamplingConfig, Task
from credo.core.rollouts import Cost, Rollouts
from credo.core.segment import SegmenterConfig, SegmentInputs, segment, segmenter_config


class Probe:
    """Counted, gradient-free access to `policy` for estimators and strategies; `metered()` reads the count."""

    def __init__(self, policy: Policy, task: Task | None, sampling: SamplingConfig, generator: torch.Generator,
                 gather: Callable[[torch.Tensor], torch.Tensor] | None = None, no_sampling: str | None = None) -> None:
        self.policy = policy
        self.task = task
        self.sampling = sampling
        self.generator = generator
        self._spent = Cost()
        self._gather = gather
        # why sampling would be wrong here (None: it is not): continuations of a multi-turn rollout's prefix
        # would be the model's own text where a tool answered, so their values would be of a policy without tools
        self.no_sampling = no_sampling

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """1-D `values` of every data-parallel shard, concatenated in shard order (this shard's own when
        the batch is not sharded). Estimators route batch-wide statistics through it, so a batch split
        into shards (verl workers, TRL processes) gets the statistics of the whole batch. A collective:
        every shard must call it the same number of times."""
        return values if self._gather is None else self._gather(values)

    @contextmanager
    def metered(self) -> Iterator[Cost]:
        """`with probe.metered() as spent:` counts every token the block scores or generates through this
        probe into `spent` (complete when the block ends). Meters nest: what an inner block spends counts
        in the enclosing one too, so an estimator called inside a metered block is counted once in each."""
        outer, self._spent = self._spent, Cost()
        try:
            yield self._spent
        finally:
            spent, self._spent = self._spent, outer
            outer.tokens_scored += spent.tokens_scored
            outer.tokens_generated += spent.tokens_generated

    @torch.no_grad()
    def score(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
              completion_mask: torch.Tensor, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs[B, T] (and entropies) of given completions; counts all real tokens forwarded."""
        self._spent.tokens_scored += int(prompt_mask.sum() + completion_mask.sum())
        return self.policy.score(prompt_ids, prompt_mask, completion_ids, completion_mask, entropy)

    @torch.no_grad()
    def completion_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                          completion_mask: torch.Tensor) -> torch.Tensor:
        """Full next-token logits[B, T, V] at each completion position (for KL-based estimators). Rows that share
        a prompt read it once where the backend can (`shared_prompt_logits`: equal up to float rounding); the cost
        counted is that of reading every row in full either way, so costs compare across backends."""
        self._spent.tokens_scored += int(prompt_mask.sum() + completion_mask.sum())
        shared = getattr(self.policy, "shared_prompt_logits", None)
        logits = shared(prompt_ids, prompt_mask, completion_ids, completion_mask) if shared is not None else None
        if logits is not None:
            return logits
        return self.policy.completion_logits(prompt_ids, prompt_mask, completion_ids, completion_mask)

    @torch.no_grad()
    def score_branches(self, rollouts: "Rollouts", branches: Sequence[tuple[int, int, Sequence[int]]],
                       reuse_prefix: bool = True) -> list[torch.Tensor]:
        """Per-token log-probs of each (row, cut, tokens) branch teacher-forced after
        prompt + completion[row, :cut]; counts the tokens actually forwarded (see the backend)."""
        out, forwarded = self.policy.score_branches(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids,
                                                    rollouts.completion_mask, branches, reuse_prefix)
        self._spent.tokens_scored += forwarded
        return out

    @torch.no_grad()
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               sampling: SamplingConfig | None = None) -> Samples:
        """Continuations of (left-padded) prefixes; counts prefix tokens as scored and new tokens as generated."""
        if self.no_sampling is not None:
            raise ValueError(self.no_sampling)
        out = self.policy.sample(prompt_ids, prompt_mask, sampling or self.sampling, self.generator)
        self._spent.tokens_scored += int(prompt_mask.sum())
        self._spent.tokens_generated += int(out.completion_mask.sum())
        return out

    def segment(self, rollouts: "Rollouts", config: "SegmenterConfig | str | dict") -> torch.Tensor:
        """segment_ids[B, T] of `rollouts` by a segmenter (entropies are scored, and counted, only if needed)."""
        cfg = segmenter_config(config)
        entropies = None
        if cfg.name == "keyword_entropy":
            _, entropies = self.score(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids,
                                      rollouts.completion_mask, entropy=True)
        strings = [self.policy.token_strings(row[m].tolist())
                   for row, m in zip(rollouts.completion_ids, rollouts.completion_mask)]
        return segment(SegmentInputs(strings, rollouts.completion_mask, rollouts.old_logprobs, entropies), cfg)


def prompt_tokens(rollouts_prompt_ids: torch.Tensor, rollouts_prompt_mask: torch.Tensor, row: int) -> list[int]:
    """The real (unpadded) prompt ids of one row."""
    return rollouts_prompt_ids[row][rollouts_prompt_mask[row]].tolist()


def sampling_refusal(rollouts: "Rollouts") -> str | None:
    """The reason a Probe on these rollouts must not sample continuations, or None. A completion whose loss
    mask has a gap (a tool's or environment's output between the model's turns: TRL's tool_mask, verl's
    multi-turn response_mask) cannot be continued by sampling the model alone: where a tool answered, the
    model would write the answer itself. Estimators that only score (rredcot, sc_grpo, ...) read it as it is."""
    if rollouts.loss_mask is None:
        return None
    if not bool((rollouts.completion_mask & ~rollouts.loss_mask).any()):
        return None
    return ("this estimator samples continuations of the completions, and these completions hold tool or "
            "environment outputs (0 in the loss mask) that sampling the model alone cannot reproduce; use an "
            "estimator that only scores the rollouts (e.g. grpo, rredcot, sc_grpo)")
