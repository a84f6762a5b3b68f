"""The audit's traces and their Monte Carlo reference values: sampled once per checkpoint, task, seed and size, and
cached (credo.lab.audit.cache) under a key of the checkpoint's weights and every setting that changes the draws."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from credo.core.config import UserError
from credo.core.files import cache_root
from credo.core.probe import Probe
from credo.core.protocols import SamplingConfig
from credo.core.rollouts import Rollouts
from credo.core.segment import default_segmenter
from credo.core.values import MCValues, mc_values
from credo.lab.audit.cache import load_cached, save_cached
from credo.lab.audit.config import AuditConfig
from credo.policy import check_task_fits, load_policy
from credo.policy.adapters import adapter_meta
from credo.policy.device import autocast_dtype, resolve_device, resolve_dtype
from credo.strategies.sampling import sample_scored
from credo.tasks import make_task


WEIGHT_FILES = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")
"""What a checkpoint's weights are in: one model.safetensors, or a Hugging Face model's shards and their index."""


def checkpoint_digest(checkpoint: str) -> str:
    """The cache key's name for the checkpoint's weights: sha256 over its weight files, by name (16 hex digits)."""
    names = sorted(n for n in os.listdir(checkpoint) if n.endswith(WEIGHT_FILES)
                   and os.path.isfile(os.path.join(checkpoint, n)))
    if not names:  # a checkpoint directory without its weights: one line, not a traceback
        raise UserError(f"audit.checkpoint={checkpoint!r}: no weights ({', '.join('*' + e for e in WEIGHT_FILES)}) "
                        "in it; the checkpoint is incomplete")
    if names == ["model.safetensors"]:
        h = hashlib.sha256()  # the one-file digest keeps the keys of audits cached before shards were read
    else:
        h = hashlib.sha256(repr(names).encode())
    for name in names:
        with open(os.path.join(checkpoint, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    adapter = adapter_meta(checkpoint)  # a LoRA adapter stands for its base too: the same adapter on another base
    if adapter is not None:             # is another policy
        h.update(adapter["base_digest"].encode())
    return h.hexdigest()[:16]


@dataclass
class AuditData:
    rollouts: Rollouts
    segment_ids: torch.Tensor
    reference: MCValues
    reference_cost: dict[str, float]
    trace_tokens: float  # mean prompt + completion tokens of sampling one trace


def with_task_segmenter(config: AuditConfig, task: Any) -> AuditConfig:
    """`config` with segmenter '' resolved to the task's own (so the cache key and audit.json name it)."""
    return config if config.segmenter else replace(config, segmenter=default_segmenter(task))


def audit_device(config: AuditConfig) -> tuple[torch.device, torch.dtype]:
    """The device and dtype the audit's model runs on (a device this machine lacks: one line naming audit.device)."""
    device = resolve_device(config.device, "audit.device")
    return device, resolve_dtype(config.dtype, device, "audit.dtype")


def reference_key(config: AuditConfig, checkpoint: str, device: torch.device, dtype: torch.dtype) -> str:
    """The cache key of the traces and their reference. A reference sampled elsewhere than on the CPU in
    float32 is another entry (its draws differ: docs/gpu.md); the CPU's keys are those of audits cached
    before devices were a setting; bfloat16-mixed is its own entry too."""
    fields = (checkpoint_digest(checkpoint), config.task, sorted(config.task_options.items()), config.seed, config.n,
              config.group_size, config.k_ref, config.segmenter, config.temperature, config.max_new_tokens)
    autocast = autocast_dtype(config.dtype)
    if device.type != "cpu" or dtype != torch.float32 or autocast is not None:
        fields += (device.type, str(dtype)) + ((f"autocast {autocast}",) if autocast is not None else ())
    return hashlib.sha256(repr(fields).encode()).hexdigest()[:16]


def audited_policy(checkpoint: str, task: Any, config: AuditConfig, device: torch.device, dtype: torch.dtype) -> Any:
    """The checkpoint's policy in eval mode, its context checked against the task's prompts (and set to cut
    them when the task asks for it: check_task_fits). No task system prompt: the audit samples bare prompts."""
    policy = load_policy(checkpoint, device=device, dtype=dtype, autocast=autocast_dtype(config.dtype))
    check_task_fits(policy, task, "audit.checkpoint", config.max_new_tokens)
    policy.model.eval()
    return policy


def build_reference(config: AuditConfig, checkpoint: str, progress: bool = True) -> AuditData:
    """Sample the traces and their MC reference, or load both from the cache; on the CPU either way."""
    task = make_task(config.task, config.task_options, prefix="audit.task_options.")
    config = with_task_segmenter(config, task)
    device, dtype = audit_device(config)
    path = os.path.join(cache_root(), "audit", reference_key(config, checkpoint, device, dtype))
    saved = load_cached(path, task.heldout_problems(config.n // config.group_size))
    if saved is not None:
        return AuditData(**saved)
    policy = audited_policy(checkpoint, task, config, device, dtype)
    sampling = SamplingConfig(config.temperature, 1.0, config.max_new_tokens)
    generator = torch.Generator().manual_seed(config.seed)
    problems = task.heldout_problems(config.n // config.group_size)
    rollouts = sample_scored(policy, task, problems, config.group_size, sampling, generator)
    probe = Probe(policy, task, sampling, torch.Generator().manual_seed(config.seed + 1))
    with probe.metered() as spent:  # the segmenter's scoring (keyword_entropy) and the MC values
        segment_ids = probe.segment(rollouts, config.segmenter)
        rollouts = rollouts.with_fields(segment_ids=segment_ids)
        start = time.time()
        if progress:
            print(f"audit: reference MC values, k_ref={config.k_ref}, {rollouts.batch_size} traces ...", flush=True)
        reference = mc_values(probe, rollouts, segment_ids, config.k_ref, config.batch_size, progress=progress)
    n = rollouts.batch_size
    reference_cost = {"tokens_scored_per_trace": spent.tokens_scored / n,
                      "tokens_generated_per_trace": spent.tokens_generated / n,
                      "seconds_per_trace": (time.time() - start) / n}
    trace_tokens = float((rollouts.prompt_mask.sum() + rollouts.completion_mask.sum()) / n)
    # kept on the CPU, as the cache reads them back (no copy when they are there already)
    rollouts, segment_ids = rollouts.to("cpu"), segment_ids.cpu()
    reference = MCValues([v.cpu() for v in reference.values], [x.cpu() for x in reference.samples])
    data = AuditData(rollouts, segment_ids, reference, reference_cost, trace_tokens)
    save_cached(path, rollouts, segment_ids, reference, reference_cost, trace_tokens)
    return data
