"""Credit you can inspect after the run: a few rollouts every N steps, with their per-token credit and the parts
that made it, in the run directory (`credo show --run RUN --step N` draws them as the heat map).

With train.credit_log_every = N > 0, step k (k a multiple of N) writes RUN/credit/step-<k:06d>.safetensors:
train.credit_log_rows rows of the step's batch, taken group by group (rows that share a prompt, so their credit
compares), groups whose rewards differ first (`logged_rows`), n rows, T trimmed to their longest completion:

  completion_ids[n, T]   int64, the completion tokens (padding after each)
  completion_mask[n, T]  uint8, 1 on real tokens;  loss_mask[n, T] uint8, 1 on the tokens that got gradient
  segment_ids[n, T]      int64, the batch's segments (-1: padding, or a batch the estimator did not segment)
  rewards[n], group[n]   float32 (after shaping) and int64 (the row's prompt in the batch)
  advantage[n, T]        float32, the estimator's advantage, 0 outside loss_mask
  weight[n, T]           float32, its token weights (1 where it has none), 0 outside loss_mask
  credit[n, T]           float32, advantage x weight: what the loss multiplies the ratio by
  grpo_part[n, T]        float32, GRPO's advantage of the row (its group's rewards, sample std, eps 1e-6) on its
                         loss_mask tokens: the share of the outcome alone
  credit_part[n, T]      float32, credit - grpo_part: what the method moved, token by token
  clipped[n, T]          uint8, 1 where the token's ratio lay outside the clip range in the step's last update
                         pass over its row (0 for the first pass of an on-policy step: ratio 1)
and as metadata (JSON strings): step, method, rows (their index in the batch), prompts, completions, correct
and tokens (each row's token strings, so the page needs no tokenizer).

safetensors: no pickle; written atomically (a reader sees a whole file or none); it reads only what the step
computed, so it consumes no random draw and every other file of the run is as without it. About
n x T x 45 bytes a file (4 rows of 512 tokens: 90 kB).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch

from credo.core.config import ConfigError
from credo.core.files import atomic_write_with
from credo.core.groups import grpo_advantages

FOLDER = "credit"
NAME = re.compile(r"^step-(\d{6,})\.safetensors$")


def path_for(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, FOLDER, f"step-{step:06d}.safetensors")


def components(rollouts: Any, credit: Any, clipped: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The per-token parts of a step's credit, [B, T] each (module docstring), over the whole batch."""
    mask = rollouts.trainable_mask()
    if credit.loss_mask is not None:
        mask = mask & credit.loss_mask.to(mask.device)
    m = mask.float()
    advantage = credit.advantages.detach().float() * m
    weight = (credit.weights.detach().float() if credit.weights is not None else torch.ones_like(advantage)) * m
    effective = advantage * weight
    grpo_part = grpo_advantages(rollouts.rewards.float(), rollouts.group)[:, None].to(m.device) * m
    return {"advantage": advantage, "weight": weight, "credit": effective, "grpo_part": grpo_part,
            "credit_part": effective - grpo_part, "loss_mask": mask,
            "clipped": (clipped.to(mask.device) & mask) if clipped is not None else torch.zeros_like(mask)}


def tracker_metrics(parts: dict[str, torch.Tensor]) -> dict[str, float]:
    """The parts as separate scalars for the trackers (credit/<part>_abs_mean over trained tokens, weight mean,
    clipped share); metrics.jsonl does not get them, so a run's record is the same with trackers or without."""
    mask = parts["loss_mask"]
    n = mask.sum().clamp(min=1).float()
    out = {f"credit/{k}_abs_mean": float(parts[k].abs().sum() / n) for k in ("credit", "grpo_part", "credit_part")}
    out["credit/weight_mean"] = float(parts["weight"].sum() / n)
    out["credit/clipped_frac"] = float(parts["clipped"].float().sum() / n)
    return out


def logged_rows(rewards: torch.Tensor, group: torch.Tensor, rows: int) -> list[int]:
    """The first `rows` rows of the batch taken group by group, the groups whose rewards differ first (their
    credit has something to say), each in batch order. A fixed rule: no random draw."""
    groups = list(dict.fromkeys(group.tolist()))
    members = {g: [i for i, x in enumerate(group.tolist()) if x == g] for g in groups}
    mixed = [g for g in groups if len({float(rewards[i]) for i in members[g]}) > 1]
    ordered = [i for g in mixed + [g for g in groups if g not in mixed] for i in members[g]]
    return ordered[:rows]


def write_step(run_dir: str, step: int, method: str, rollouts: Any, parts: dict[str, torch.Tensor], rows: int,
               token_strings: Any) -> str:
    """RUN/credit/step-<step>.safetensors of the first `rows` rows (module docstring); returns its path.
    token_strings(ids) -> each token's text (the policy's)."""
    from safetensors.torch import save_file
    index = logged_rows(rollouts.rewards, rollouts.group, rows)
    mask = rollouts.completion_mask[index].cpu()
    T = max(int(mask.sum(1).max()) if mask.numel() else 0, 1)
    ids = rollouts.completion_ids[index, :T].cpu()
    segments = (rollouts.segment_ids[index, :T].cpu() if rollouts.segment_ids is not None
                else torch.full_like(ids, -1))
    tensors = {"completion_ids": ids.long(), "completion_mask": mask[:, :T].to(torch.uint8),
               "segment_ids": segments.long(), "rewards": rollouts.rewards[index].float().cpu(),
               "group": rollouts.group[index].long().cpu()}
    for name, value in parts.items():
        kept = value[index, :T].cpu()
        tensors[name] = kept.to(torch.uint8) if kept.dtype == torch.bool else kept.float()
    tokens = [token_strings(ids[j][mask[j, :T]].tolist()) for j in range(len(index))]
    meta = {"step": str(step), "method": method, "rows": json.dumps(index),
            "prompts": json.dumps([getattr(rollouts.problems[i], "prompt", "") if rollouts.problems else ""
                                   for i in index]),
            "completions": json.dumps([rollouts.completions[i] if rollouts.completions else "" for i in index]),
            "correct": json.dumps([bool(rollouts.correct[i]) for i in index]), "tokens": json.dumps(tokens)}
    path = path_for(run_dir, step)
    atomic_write_with(path, lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=meta))
    return path


def logged_steps(run_dir: str) -> list[int]:
    """The steps with a credit file in run_dir, ascending."""
    folder = os.path.join(run_dir, FOLDER)
    if not os.path.isdir(folder):
        return []
    return sorted(int(m.group(1)) for m in map(NAME.match, os.listdir(folder)) if m)


def read_step(run_dir: str, step: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, metadata with its JSON decoded) of RUN/credit/step-<step>.safetensors; a missing or unreadable
    file is one ConfigError naming it (and the steps the run has)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open
    path = path_for(run_dir, step)
    if not os.path.exists(path):
        steps = logged_steps(run_dir)
        have = (f"it has steps {', '.join(map(str, steps))}" if steps else
                "it has none (a run logs credit every train.credit_log_every steps; 0 turns it off)")
        raise ConfigError(f"--step {step}: {path} does not exist; {have}")
    try:
        tensors = load_file(path)
        with safe_open(path, "pt") as f:
            raw = f.metadata() or {}
        meta = {k: (v if k == "method" else json.loads(v)) for k, v in raw.items()}
    except (SafetensorError, OSError, ValueError) as err:
        raise ConfigError(f"{path} is not a credo credit file ({type(err).__name__}: {err})") from None
    missing = [k for k in ("completion_ids", "completion_mask", "credit", "grpo_part", "credit_part", "weight",
                           "clipped", "segment_ids") if k not in tensors]
    missing += [k for k in ("step", "tokens", "prompts", "correct") if k not in meta]
    if missing:
        raise ConfigError(f"{path} is not a credo credit file: it lacks {', '.join(missing)}")
    return tensors, meta
