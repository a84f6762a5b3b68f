"""`credo show --run RUN --step N`: the credit a training run logged at step N (credo.train.credit_log), drawn as
`credo show`'s heat map, one column per part of it:

  credit       advantage x weight, what the update multiplied the ratio by
  GRPO part    the row's GRPO advantage (its group's rewards alone)
  credit part  credit - GRPO part: what the method moved, token by token
  weight - 1   the method's token weights around 1 (0: no reweighting)
  clipped      the credit of the tokens whose ratio was clipped in the step's update (0 elsewhere)

No model is loaded and nothing is sampled: the file holds the tokens' text. Segments (one line each) are the
batch's, when the estimator read them; else a row is one line.
"""

from __future__ import annotations

import torch

from credo.lab.show.view import Page, Segment, Trace
from credo.train.credit_log import read_step

PARTS = (("credit", "credit"), ("GRPO part", "grpo_part"), ("credit part", "credit_part"), ("weight - 1", None),
         ("clipped", None))
"""(column, tensor of the credit file) in page order; None: computed from the file (weight - 1, clipped)."""


def part_values(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """column -> values[n, T] (PARTS)."""
    mask = tensors["loss_mask"].bool() if "loss_mask" in tensors else tensors["completion_mask"].bool()
    out = {label: tensors[key].float() for label, key in PARTS if key is not None}
    out["weight - 1"] = (tensors["weight"].float() - 1.0) * mask
    out["clipped"] = tensors["credit"].float() * tensors["clipped"].bool()
    return out


def _segments(tokens: list[str], segment_ids: torch.Tensor, values: dict[str, torch.Tensor]) -> list[Segment]:
    """One Segment per segment id of the row's real tokens (consecutive runs), or one for the whole row."""
    n = len(tokens)
    ids = segment_ids[:n].tolist()
    cuts = [0] + [t for t in range(1, n) if ids[t] != ids[t - 1]] + [n] if n and min(ids) >= 0 else [0, n]
    return [Segment(tokens=tokens[a:b], ok=None, credit={label: v[a:b].tolist() for label, v in values.items()})
            for a, b in zip(cuts, cuts[1:]) if b > a]


def page_from_run(run_dir: str, step: int) -> Page:
    """The Page of RUN/credit/step-<step>.safetensors (a missing or foreign file: one ConfigError naming it)."""
    tensors, meta = read_step(run_dir, step)
    parts = part_values(tensors)
    traces = []
    for j, tokens in enumerate(meta["tokens"]):
        row_values = {label: v[j] for label, v in parts.items()}
        traces.append(Trace(j + 1, meta["prompts"][j], bool(meta["correct"][j]), None,
                            _segments(tokens, tensors["segment_ids"][j], row_values)))
    real = tensors["completion_mask"].bool()
    every = torch.cat([v[real].abs() for v in parts.values()])
    every = every[every > 0]
    scale = float(torch.quantile(every, 0.98)) if every.numel() else 1.0
    nan = float("nan")
    summary = [{"label": label, "first_error_top1": nan, "cost_vs_step": None, "tokens_per_trace": None}
               for label in parts]
    rewards = ", ".join(f"{float(r):.2f}" for r in tensors["rewards"]) if "rewards" in tensors else "?"
    subtitle = (f"run {run_dir} · step {meta['step']} · method {meta.get('method', '?')} · {len(traces)} logged rows "
                f"(rewards {rewards}); columns: the credit and its parts")
    return Page("credo show --run", subtitle, summary, list(parts), traces, scale or 1.0, False)
