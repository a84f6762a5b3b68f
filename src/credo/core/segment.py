"""Segmenters: completion tokens -> `segment_ids[B, T]` (segment index per token, -1 on padding).

Every segmenter works on token *strings* (so it runs unchanged on a character tokenizer and on a
BPE tokenizer whose tokens straddle a newline) and returns the tokens at which a new segment starts.
- `lines`:     cut after each occurrence of a delimiter ("\\n", "\\n\\n", "</thought>", ...).
- `fixed`:     a new segment every `n` tokens.
- `cutpoints`: SPO-chain: cut before tokens whose old-policy probability is below `p`, keeping every
               `every`-th such cutpoint.
- `keyword_entropy`: RREDCoT-style (ours in detail): candidate cuts at paragraph breaks, before
               discourse keywords at a line or sentence start, and before tokens whose entropy is in
               the top decile of the trace; then segments shorter than `min_len` are merged into the
               previous one, segments longer than `max_len` are split, at most `max_segments` are
               kept (the weakest cuts dropped first), and the final answer is its own last segment.
A cut that would leave a segment holding only the trailing EOS is dropped in every segmenter.

Segmentation is one stage of the data path: `with_segments` fills `Rollouts.segment_ids` once per batch,
by the task's own segmenter (`task.default_segmenter`: `lines` on arithmetic, `keyword_entropy` on
free-form CoT), and every segment-level estimator and the audit read those segments
(`segments_for`); an estimator's explicit `segmenter` option still cuts its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from credo.core.config import check, from_dict
from credo.core.rollouts import Cost

KEYWORDS = ("Wait", "But", "So", "Therefore", "Alternatively", "Let me", "Now", "Finally", "Hmm", "However",
            "Thus", "Next", "First", "Then", "Check", "Actually")


@dataclass(frozen=True)
class SegmenterConfig:
    """name: lines | fixed | cutpoints | keyword_entropy.
    delimiter (lines): text after which a segment ends. n (fixed): tokens per segment.
    p, every (cutpoints): probability threshold and keep-every-m-th.
    min_len, max_len, max_segments, keywords, entropy_quantile, answer_pattern (keyword_entropy)."""

    name: str = "lines"
    delimiter: str = "\n"
    n: int = 16
    p: float = 0.9
    every: int = 1
    min_len: int = 8
    max_len: int = 256
    max_segments: int = 16
    keywords: tuple[str, ...] = KEYWORDS
    entropy_quantile: float = 0.9
    answer_pattern: str = r"####|\\boxed|The final answer"

    def __post_init__(self) -> None:
        check(self.name in SEGMENTERS, f"segmenter.name must be one of {sorted(SEGMENTERS)}, got {self.name!r}")
        check(self.delimiter != "", "segmenter.delimiter must not be empty")
        check(self.n > 0, f"segmenter.n must be > 0, got {self.n}")
        check(0 < self.p <= 1, f"segmenter.p must be in (0, 1], got {self.p}")
        check(self.every > 0, f"segmenter.every must be > 0, got {self.every}")
        check(0 < self.min_len <= self.max_len,
              f"segmenter.min_len/max_len must satisfy 0 < min <= max, got {self.min_len}/{self.max_len}")
        check(self.max_segments > 0, f"segmenter.max_segments must be > 0, got {self.max_segments}")
        check(0 < self.entropy_quantile <= 1,
              f"segmenter.entropy_quantile must be in (0, 1], got {self.entropy_quantile}")


def segmenter_config(value: Any) -> SegmenterConfig:
    """A SegmenterConfig from a name ('lines') or a mapping ({'name': 'fixed', 'n': 8})."""
    if isinstance(value, SegmenterConfig):
        return value
    if isinstance(value, str):
        return SegmenterConfig(name=value)
    return from_dict(SegmenterConfig, dict(value), prefix="segmenter.")


DEFAULT_SEGMENTER = "lines"


def default_segmenter(task: Any) -> str:
    """The segmenter a task's completions are cut by: its `default_segmenter`, else `lines`."""
    return getattr(task, "default_segmenter", None) or DEFAULT_SEGMENTER


def check_segmenter_option(value: Any) -> None:
    """An estimator's `segmenter` option: '' (the batch's own segments, see `segments_for`) or a
    segmenter name or mapping, checked now (naming the field)."""
    if value != "":
        segmenter_config(value)


def segments_for(rollouts: Any, probe: Any, segmenter: Any = "") -> torch.Tensor:
    """segment_ids[B, T] an estimator reads: cut afresh by an explicit `segmenter` (the estimator's own
    option); otherwise the batch's own `rollouts.segment_ids`, and for a batch not segmented yet the
    task's default segmenter. `probe` (a credo.core.probe.Probe) cuts: it holds the tokenizer, the task and
    counts the entropy pass `keyword_entropy` needs."""
    if segmenter == "" and rollouts.segment_ids is not None:
        return rollouts.segment_ids
    if probe is None:
        raise ValueError("segmenting a batch needs a Probe (or rollouts.segment_ids already filled)")
    return probe.segment(rollouts, segmenter if segmenter != "" else default_segmenter(probe.task))


def segmentation_stage(rollouts: Any, probe: Any, needed: bool) -> tuple[Any, Any]:
    """(rollouts with segment_ids, what cutting them spent through `probe` as a credo.core.rollouts.Cost): the
    stage the trainer, TRL and verl run before an estimator that reads the batch's segments (`needed`:
    EstimatorSpec.reads_batch_segments); (rollouts, no cost) when not needed."""
    if not needed:
        return rollouts, Cost()
    with probe.metered() as spent:
        rollouts = with_segments(rollouts, probe)
    return rollouts, spent


def with_segments(rollouts: Any, probe: Any) -> Any:
    """The segmentation stage: `rollouts` with `segment_ids` filled by the task's default segmenter
    (returned unchanged when they are filled already)."""
    if rollouts.segment_ids is not None:
        return rollouts
    return rollouts.with_fields(segment_ids=segments_for(rollouts, probe))


@dataclass
class SegmentInputs:
    """What a segmenter may read for one batch: token strings per row (real tokens only, EOS as ''),
    the completion mask, old log-probs [B, T] and optionally entropies [B, T]."""

    token_strings: list[list[str]]
    completion_mask: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    entropies: torch.Tensor | None = None


def ids_from_starts(starts: list[list[int]], completion_mask: torch.Tensor) -> torch.Tensor:
    """Per-row sorted start positions -> segment_ids[B, T] (-1 on padding). Position 0 always starts."""
    B, T = completion_mask.shape
    flags = torch.zeros(B, T, dtype=torch.long)
    for i, row in enumerate(starts):
        n = int(completion_mask[i].sum())
        for s in row:
            if 0 < s < n:
                flags[i, s] = 1
        if n:
            flags[i, 0] = 1
    ids = flags.cumsum(1) - 1
    return torch.where(completion_mask.cpu(), ids, torch.full_like(ids, -1)).to(completion_mask.device)


def _drop_eos_only_tail(starts: list[int], tokens: Sequence[str]) -> list[int]:
    n = len(tokens)
    return [s for s in starts if not (s == n - 1 and tokens[-1] == "")]


def _char_offsets(tokens: Sequence[str]) -> list[int]:
    """End offset (exclusive) in the joined text of each token."""
    out, pos = [], 0
    for t in tokens:
        pos += len(t)
        out.append(pos)
    return out


def _token_at(offsets: list[int], char_index: int) -> int:
    """Index of the token containing character `char_index`."""
    lo, hi = 0, len(offsets) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if offsets[mid] > char_index:
            hi = mid
        else:
            lo = mid + 1
    return lo


def starts_after(tokens: Sequence[str], pattern: str) -> list[int]:
    """Tokens that start right after each occurrence of literal `pattern` in the joined text."""
    text = "".join(tokens)
    offsets = _char_offsets(tokens)
    starts = []
    for m in re.finditer(re.escape(pattern), text):
        starts.append(_token_at(offsets, m.end() - 1) + 1)
    return sorted(set(starts))


def lines_starts(tokens: Sequence[str], inputs: SegmentInputs, row: int, cfg: SegmenterConfig) -> list[int]:
    return starts_after(tokens, cfg.delimiter)


def fixed_starts(tokens: Sequence[str], inputs: SegmentInputs, row: int, cfg: SegmenterConfig) -> list[int]:
    return list(range(cfg.n, len(tokens), cfg.n))


def cutpoint_starts(tokens: Sequence[str], inputs: SegmentInputs, row: int, cfg: SegmenterConfig) -> list[int]:
    if inputs.old_logprobs is None:
        raise ValueError("the cutpoints segmenter needs old_logprobs")
    probs = inputs.old_logprobs[row, :len(tokens)].exp()
    cuts = [t for t in range(1, len(tokens)) if float(probs[t]) < cfg.p]
    return cuts[cfg.every - 1::cfg.every]


def keyword_entropy_starts(tokens: Sequence[str], inputs: SegmentInputs, row: int, cfg: SegmenterConfig) -> list[int]:
    n = len(tokens)
    text = "".join(tokens)
    offsets = _char_offsets(tokens)
    strength: dict[int, float] = {}  # candidate start -> priority (higher survives the cap)
    for s in starts_after(tokens, "\n\n"):
        strength[s] = 3.0
    keyword_re = re.compile(r"(?:^|(?<=\n)|(?<=[.!?] ))(" + "|".join(re.escape(k) for k in cfg.keywords) + r")\b")
    for m in keyword_re.finditer(text):
        t = _token_at(offsets, m.start(1))
        strength[t] = max(strength.get(t, 0.0), 2.0)
    if inputs.entropies is not None and n > 1:
        ent = inputs.entropies[row, :n].float()
        threshold = torch.quantile(ent, cfg.entropy_quantile)
        for t in (ent >= threshold).nonzero().flatten().tolist():
            if t > 0:
                strength[t] = max(strength.get(t, 0.0), 1.0 + float(ent[t]) * 1e-3)
    answer = re.search(cfg.answer_pattern, text)
    answer_start = _token_at(offsets, answer.start()) if answer else None
    # the answer is its own last segment: drop candidates inside it, force a cut at its start
    if answer_start is not None:
        strength = {s: v for s, v in strength.items() if s < answer_start}
    starts = _enforce_lengths(sorted(strength), strength, answer_start if answer_start is not None else n, cfg)
    if answer_start is not None and 0 < answer_start < n:
        starts.append(answer_start)
    return starts


def _enforce_lengths(candidates: list[int], strength: dict[int, float], end: int, cfg: SegmenterConfig) -> list[int]:
    """Merge segments shorter than min_len, split those longer than max_len, cap the count."""
    kept: list[int] = []
    last = 0
    for s in candidates:
        if s - last >= cfg.min_len and end - s >= 1:
            kept.append(s)
            last = s
    bounds = [0] + kept + [end]
    for a, b in zip(bounds[:-1], bounds[1:]):
        for s in range(a + cfg.max_len, b, cfg.max_len):
            kept.append(s)
            strength[s] = 0.5
    kept = sorted(set(kept))
    limit = cfg.max_segments - 2  # room for the first segment and the answer segment
    if len(kept) > max(limit, 0):
        kept = sorted(sorted(kept, key=lambda s: -strength.get(s, 0.0))[:max(limit, 0)])
    return kept


SEGMENTERS: dict[str, Callable[[Sequence[str], SegmentInputs, int, SegmenterConfig], list[int]]] = {
    "lines": lines_starts,
    "fixed": fixed_starts,
    "cutpoints": cutpoint_starts,
    "keyword_entropy": keyword_entropy_starts,
}


def segment(inputs: SegmentInputs, config: SegmenterConfig | str) -> torch.Tensor:
    """-> segment_ids[B, T]: segment index of each completion token, -1 on padding."""
    cfg = segmenter_config(config)
    fn = SEGMENTERS[cfg.name]
    starts = []
    for row, tokens in enumerate(inputs.token_strings):
        starts.append(_drop_eos_only_tail(fn(tokens, inputs, row, cfg), tokens) if tokens else [])
    return ids_from_starts(starts, inputs.completion_mask)


def segment_bounds(segment_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """segment_ids[B, T] -> per row, [(start, end)) token ranges of each segment in order."""
    out = []
    for row in segment_ids.tolist():
        bounds: list[tuple[int, int]] = []
        for t, s in enumerate(row):
            if s < 0:
                break
            if s == len(bounds):
                bounds.append((t, t + 1))
            else:
                bounds[-1] = (bounds[-1][0], t + 1)
        out.append(bounds)
    return out


def segment_means(values: torch.Tensor, segment_ids: torch.Tensor) -> list[torch.Tensor]:
    """values[B, T] -> per row, the mean of `values` over each segment's tokens (1-D, one per segment)."""
    out = []
    for row, bounds in enumerate(segment_bounds(segment_ids)):
        out.append(torch.stack([values[row, a:b].float().mean() for a, b in bounds]) if bounds else torch.zeros(0))
    return out


def broadcast_segments(segment_values: Sequence[torch.Tensor], segment_ids: torch.Tensor) -> torch.Tensor:
    """Per-row segment values -> [B, T] with each token given its segment's value (0 on padding)."""
    out = torch.zeros(segment_ids.shape, dtype=torch.float32, device=segment_ids.device)
    for row, values in enumerate(segment_values):
        ids = segment_ids[row]
        real = ids >= 0
        if values.numel():
            out[row, real] = values.to(out.device, torch.float32)[ids[real]]
    return out
