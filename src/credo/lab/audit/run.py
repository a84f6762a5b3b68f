"""`credo audit`: how right is each estimator's credit, and what does it cost?

Protocol (docs/methods.md, "## How fidelity is judged"):
1. sample `n` held-out traces from the checkpoint (n / group_size prompts x group_size samples, so
   group-based estimators see real groups);
2. cut them into segments once, by the task's segmenter (`lines` on arith: one arithmetic step per
   segment) unless `segmenter` is set, and compute reference MC values with `k_ref` continuations per
   boundary (cached per checkpoint / seed / n / k_ref / segmenter);
3. run every requested estimator through a fresh counted Probe on those segments, then score it per trace.
Metric definitions (docs/methods.md, "## How fidelity is judged"):
- segment credit of any estimator = mean over the segment's tokens of advantage x weight (what the
  loss optimises; weight-only methods such as SC-GRPO would otherwise score as plain GRPO);
- `spearman` / `pearson`: per trace, between segment credit and the reference differences
  V(s_k) - V(s_{k-1}); averaged over traces with >= 2 segments and a non-constant reference. An
  estimator whose credit is constant on a trace scores 0 there (it ranks nothing);
- `first_error_top1`: over incorrect traces whose first wrong step is one of their segments, the
  share whose most negative segment is that step; ties share the hit (1/|argmin set|), so uniform
  credit scores like a random guess;
- `pairwise`: over (first wrong step e, earlier correct step j < e) pairs of those traces, the share
  where e gets less credit than j (ties count 1/2): a rank measure that is not all-or-nothing;
- `*_localisable`: the same on *localisable* traces, where the reference value drops by >= 0.15 at
  the labelled error (elsewhere no outcome-based value can see the error);
- cost: tokens scored and generated per trace by the estimator, seconds per trace, and
  `cost_vs_grpo_step` = (tokens scored + generated) / (tokens of sampling the trace itself).
Rows `random`, `grpo` (uniform), `first_step` (always blames step 1) and `position_prior` (always
blames the most frequent first-error position) are floors; `mc_reference` is the reference itself
(its fidelity is 1 by construction; its reliability is reported in the config: the split-half
Spearman of its two halves and its Spearman-Brown correction 2r/(1+r), the reliability of the full
reference, whose square root bounds the Spearman any estimator can reach against it).
Localisers (`localisers`) are scored on each parent alone, as at training time.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from credo import credit as credit_registry
from credo.lab.audit.cache import load_cached, save_cached
from credo.core.config import MAX_GROUP, MAX_HELD_OUT, MAX_SAMPLES, UserError, check, check_in, to_dict
from credo.core.values import MCValues, mc_values
from credo.policy import check_task_fits, load_policy
from credo.policy.adapters import adapter_meta
from credo.train.starts import resolve_checkpoint
from credo.policy.device import autocast_dtype, check_device_fields, device_name, resolve_device, resolve_dtype
from credo.policy.base import SamplingConfig
from credo.core.probe import Probe
from credo.core.rollouts import Rollouts
from credo.core.files import atomic_write_json, atomic_write_text, cache_root
from credo.core.segment import SEGMENTERS, default_segmenter, segment_means
from credo.lab.audit.report import (FLOORS, METRICS, Labels, fidelity, first_error_top1, floor_credit,  # noqa: F401
                                    pick_figures, routed_rows, weight_concentration, localisable_errors,
                                    localiser_table, markdown_table, most_frequent_position, first_errors,
                                    checked_methods, pairwise_rank, parse_method, plot_audit, score_row,
                                    split_half_spearman, random_expectation)
from credo.lab.audit.premises import (conditions_on_solution, kl_argmax_hits, parse_figures, teacher_gain,
                                  teacher_table, teacher_warning, unprivileged_twins)
from credo.strategies.sampling import sample_scored
from credo.tasks import make_task

@dataclass(frozen=True)
class AuditConfig:
    """What `credo audit` scores against the Monte Carlo reference."""

    checkpoint: str = ""
    """A credo checkpoint, a Hugging Face model directory, smollm2-135m or a training run (its final/);
    '' or 'sft' = the task's SFT start (credo.train.starts.resolve_checkpoint)."""
    task: str = "arith"
    """Task: 'arith', 'arith-long', 'gym:<dataset>' or 'jsonl:<path>'."""
    task_options: dict = field(default_factory=dict)
    """The task's own options."""
    n: int = 256
    """Traces audited (n / group_size held-out prompts)."""
    group_size: int = 8
    """Traces sampled per prompt (the group the estimators see)."""
    k_ref: int = 32
    """MC continuations per segment boundary for the reference values."""
    methods: tuple[str, ...] = ("vineppo",)
    """Estimator specs, each 'name' or 'name:key=value:key=value' (e.g. 'vineppo:k=9'); the random, grpo and
    first_step floors are always added."""
    localisers: tuple[str, ...] = ()
    """Reset localisers scored against the first wrong step (random, value, oracle, self; prompt needs a model that
    can read the task's localisation request: a chat model, or sft:arith-long-skilled on arith-long)."""
    segmenter: str = ""
    """Audit segments, every estimator's too ('' = the task's own: lines on arith, one step each, so step
    labels line up; keyword_entropy on free-form tasks)."""
    temperature: float = 1.0
    """Sampling temperature of the traces and the reference."""
    max_new_tokens: int = 96
    """Generation limit per completion."""
    batch_size: int = 1024
    """Rows per forward pass of the reference sampling."""
    device: str = "auto"
    """Where the model runs: auto (CUDA when torch finds a GPU, else the CPU), cpu, cuda or cuda:N (docs/gpu.md)."""
    dtype: str = "float32"
    """float32; bfloat16 (a Hugging Face model's weights, on a GPU); or bfloat16-mixed (float32 weights, matrix
    products in bfloat16 under torch.autocast: a Hugging Face model, on a CPU with AMX/AVX512-BF16 or a GPU)."""
    seed: int = 0
    """Seed of the sampled traces and the reference."""
    localiser_max_new_tokens: int = field(default=4096, metadata={"omit_default": True})
    """Reply limit of the `prompt` localiser's request (SRPO's public code and reset.prompt_max_new_tokens: 4096;
    a small chat model on a CPU may ramble to it, so an audit there may cap it and says so in audit.json)."""

    def __post_init__(self) -> None:
        check_device_fields(self.device, self.dtype, "audit.")
        check_in(self.localiser_max_new_tokens, 1, 4096, "audit.localiser_max_new_tokens")
        check_in(self.group_size, 2, MAX_GROUP, "audit.group_size")
        check(self.n >= self.group_size >= 2,
              f"audit.n must be >= audit.group_size >= 2, got {self.n}/{self.group_size}")
        check(self.k_ref >= 2, f"audit.k_ref must be >= 2, got {self.k_ref}")
        check_in(self.n, 2, MAX_HELD_OUT, "audit.n")
        check_in(self.k_ref, 2, MAX_SAMPLES, "audit.k_ref")
        check(self.temperature > 0, f"audit.temperature must be > 0, got {self.temperature}")
        check(1 <= self.max_new_tokens <= 4096, f"audit.max_new_tokens must be in 1..4096, got {self.max_new_tokens}")
        check(self.batch_size >= 1, f"audit.batch_size must be >= 1, got {self.batch_size}")
        check(self.segmenter == "" or self.segmenter in SEGMENTERS,
              f"audit.segmenter must be '' (the task's own) or one of {sorted(SEGMENTERS)}, got {self.segmenter!r}")
        from credo.strategies import LOCALISERS
        for name in self.localisers:
            check(name in LOCALISERS.names(),
                  f"audit.localisers: unknown localiser {name!r}; available: {tuple(LOCALISERS.names())}")


WEIGHT_FILES = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")
"""What a checkpoint's weights are in: one model.safetensors, or a Hugging Face model's shards and their index."""


def _weights_digest(checkpoint: str) -> str:
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
    fields = (_weights_digest(checkpoint), config.task, sorted(config.task_options.items()), config.seed, config.n,
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


def segment_credit_of(result: Any, segment_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per row, the mean over each segment of advantages x weights (weights None means 1)."""
    effective = result.advantages if result.weights is None else result.advantages * result.weights
    return [means.cpu() for means in segment_means(effective, segment_ids)]  # scored beside the CPU reference


def run_audit(config: AuditConfig, out_dir: str, progress: bool = True) -> dict[str, Any]:
    """Run the audit and write audit.json, audit.md, audit.png and audit.html (with a `credo show` grid) to out_dir."""
    methods = unprivileged_twins(checked_methods(config.methods))  # before the (slow) reference: a typo fails at once
    checkpoint = resolve_checkpoint(config.checkpoint, "audit.checkpoint", task=config.task, progress=progress)
    task = make_task(config.task, config.task_options, prefix="audit.task_options.")
    config = with_task_segmenter(config, task)
    data = build_reference(config, checkpoint, progress)
    rollouts, segment_ids = data.rollouts, data.segment_ids
    reference, n = data.reference.differences(), rollouts.batch_size
    first = first_errors(task, rollouts)
    labels = Labels(first, localisable_errors(data.reference, first))
    prior = most_frequent_position(first, reference)
    rows: dict[str, dict[str, float]] = {}
    zero_cost = {"tokens_scored_per_trace": 0.0, "tokens_generated_per_trace": 0.0, "seconds_per_trace": 0.0}
    for name in FLOORS:
        rows[name] = score_row(floor_credit(name, reference, config.seed, prior), reference, labels, zero_cost,
                               data.trace_tokens)
    device, dtype = audit_device(config)
    policy = audited_policy(checkpoint, task, config, device, dtype)
    on_device, segments_on_device = rollouts.to(policy.device), segment_ids.to(policy.device)

    def record(label: str, credit: list[torch.Tensor], cost: dict[str, float]) -> None:
        rows[label] = score_row(credit, reference, labels, cost, data.trace_tokens)

    credits: dict[str, Any] = {}  # label -> Credit, for the show grid of audit.html
    failures = score_methods(config, methods, on_device, segments_on_device, policy, task, progress, record, credits)
    rows.update(routed_rows(methods, {label: segment_credit_of(c, segments_on_device) for label, c in credits.items()},
                            rows, on_device, reference, labels, data.trace_tokens))
    rows["mc_reference"] = score_row(reference, reference, labels, data.reference_cost, data.trace_tokens)
    split_half = split_half_spearman(data.reference)
    reliability = 2 * split_half / (1 + split_half) if split_half > -1 else float("nan")
    report: dict[str, Any] = {
        "config": {**to_dict(config), "checkpoint": checkpoint, "device": device_name(policy.device), "traces": n,
                   "incorrect_with_first_error": sum(1 for f, r in zip(first, reference)
                                                     if f is not None and f < len(r)),
                   "localisable_traces": sum(f is not None for f in labels.localisable),
                   "position_prior_step": prior,
                   "mean_segments_per_trace": sum(len(r) for r in reference) / max(n, 1),
                   "traces_scored_for_correlation": fidelity(reference, reference)[2],
                   "reference_split_half_spearman": split_half,
                   "reference_reliability_spearman_brown": reliability,
                   "spearman_ceiling": math.sqrt(reliability) if reliability >= 0 else float("nan"),
                   "random_first_error_expectation": random_expectation(reference, first),
                   "trace_tokens": data.trace_tokens, "failures": failures,
                   "privileged_methods": [label for label, name, options in methods
                                          if credit_registry.get(name).reads_privileged(options)]},
        "methods": rows,
    }
    table = markdown_table(report)
    if any(conditions_on_solution(name, options) for _, name, options in methods):
        report["premises"] = {"teacher": check_teacher(config, rollouts, segment_ids, first, policy, task, progress)}
        table += "\n" + teacher_table(report["premises"]["teacher"])
    if config.localisers:
        report["localisers"] = audit_localisers(config, on_device, segments_on_device, data.reference, labels, policy,
                                                task, progress)
        table += "\n" + localiser_table(report["localisers"])
    write_audit(out_dir, report, table)
    from credo.lab.show.view import write_audit_page
    write_audit_page(out_dir, table, task, policy, rollouts, segment_ids, data.reference, credits, data.trace_tokens)
    return report


def check_teacher(config: AuditConfig, rollouts: Rollouts, segment_ids: torch.Tensor, first: list[int | None],
                  policy: Any, task: Any, progress: bool) -> dict[str, float]:
    """The teacher premise check (credo.lab.audit.premises); its warning, if any, is printed as one line."""
    if progress:
        print("audit: premise check: the teacher ...", flush=True)
    probe = Probe(policy, task, SamplingConfig(config.temperature, 1.0, config.max_new_tokens),
                  torch.Generator().manual_seed(config.seed + 4))
    check = {**teacher_gain(rollouts, policy, task), **kl_argmax_hits(rollouts, segment_ids, first, probe)}
    warning = teacher_warning(check)
    if warning:
        print(f"credo audit: {warning}", file=sys.stderr)
    return check


def write_audit(out_dir: str, report: dict[str, Any], table: str) -> None:
    """audit.json (+ localisers.json), audit.md and audit.png, each written atomically."""
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_json(os.path.join(out_dir, "audit.json"), report)
    if "localisers" in report:
        atomic_write_json(os.path.join(out_dir, "localisers.json"), report["localisers"])
    atomic_write_text(os.path.join(out_dir, "audit.md"), table)
    plot_audit(report, os.path.join(out_dir, "audit.png"))


def score_methods(config: AuditConfig, methods: list[tuple[str, str, Any]], rollouts: Rollouts,
                  segment_ids: torch.Tensor, policy: Any, task: Any, progress: bool, record: Any,
                  credits: dict[str, Any] | None = None) -> dict[str, str]:
    """Run each estimator through a fresh counted Probe; record(label, segment credit, cost); each Credit
    is kept in `credits` when given. A failed method is reported (returned), never hidden, and the audit goes on."""
    failures: dict[str, str] = {}
    sampling = SamplingConfig(config.temperature, 1.0, config.max_new_tokens)
    n = rollouts.batch_size
    done: set[str] = set(FLOORS)  # a floor's label (e.g. grpo) keeps its floor row
    for label, name, est_config in methods:
        if label in done:
            continue
        done.add(label)
        try:
            probe = Probe(policy, task, sampling, torch.Generator().manual_seed(config.seed + 2))
            if progress:
                print(f"audit: {label} ...", flush=True)
            start = time.time()
            result = credit_registry.get(name)(rollouts, probe, est_config)
            seconds = time.time() - start
            if credits is not None:
                credits[label] = result
            record(label, segment_credit_of(result, segment_ids),
                   {"tokens_scored_per_trace": result.cost.tokens_scored / n,
                    "tokens_generated_per_trace": result.cost.tokens_generated / n, "seconds_per_trace": seconds / n,
                    **weight_concentration(result.weights, rollouts.trainable_mask())})
        except Exception as err:  # noqa: BLE001 (reported in the table and the exit status)
            failures[label] = f"{type(err).__name__}: {err}"
    return failures


def audit_localisers(config: AuditConfig, rollouts: Rollouts, segment_ids: torch.Tensor, reference: MCValues,
                     labels: Labels, policy: Any, task: Any, progress: bool) -> dict[str, Any]:
    """For each localiser, on incorrect traces with a labelled first error e that is not their last
    segment, each parent valued alone as at training time: localisation_top1 = share where it picks
    e (also on localisable traces); step1_share = share of picks at step 1; reset_success = mean
    reference value V(s_k) of its reset state (prefix = steps < k); after_error_success = mean
    V(s_{e+1}); clean_prefix_gain = their difference (the paper's "a clean prefix corrects more often")."""
    import random as _random
    from credo.strategies.localisers import LOCALISERS, localise
    first = labels.first
    rows = [i for i, f in enumerate(first) if f is not None and f < len(reference.values[i]) - 1]
    out: dict[str, Any] = {
        "traces": len(rows), "oracle_step1_share": sum(first[i] == 0 for i in rows) / max(len(rows), 1),
        "random_top1_expectation": sum(1 / (len(reference.values[i]) - 1) for i in rows) / max(len(rows), 1),
        "oracle_share_by_step": pick_figures([first[i] for i in rows], [first[i] for i in rows])["share_by_step"],
        "localisers": {}, "failures": {},
        "privileged_localisers": [n for n in config.localisers if LOCALISERS.get(n).reads_privileged()]}
    sampling = SamplingConfig(config.temperature, 1.0, config.max_new_tokens)
    for name in config.localisers:
        if progress:
            print(f"audit: localiser {name} ...", flush=True)
        probe = Probe(policy, task, sampling, torch.Generator().manual_seed(config.seed + 3))
        try:
            notes: dict[str, Any] = {}
            with probe.metered() as spent:
                picks = localise(name, rollouts, rows, probe, segment_ids, _random.Random(config.seed), notes=notes,
                                 prompt_max_new_tokens=config.localiser_max_new_tokens)
        except Exception as err:  # noqa: BLE001 (reported, the audit goes on)
            out["failures"][name] = f"{type(err).__name__}: {err}"
            continue
        n = max(len(rows), 1)
        loc = [(k, i) for k, i in zip(picks, rows) if labels.localisable[i] is not None]
        success = sum(float(reference.values[i][k]) for k, i in zip(picks, rows))
        after = sum(float(reference.values[i][first[i] + 1]) for i in rows)
        out["localisers"][name] = {
            "localisation_top1": sum(k == first[i] for k, i in zip(picks, rows)) / n,
            "localisation_top1_localisable": sum(k == first[i] for k, i in loc) / max(len(loc), 1),
            "step1_share": sum(k == 0 for k in picks) / n,
            "reset_success": success / n, "after_error_success": after / n, "clean_prefix_gain": (success - after) / n,
            "tokens_scored_per_trace": spent.tokens_scored / n,
            "tokens_generated_per_trace": spent.tokens_generated / n, **parse_figures(notes),
            **pick_figures(picks, [first[i] for i in rows])}
    ran = out["localisers"]
    out["privileged_localisers"] = [n for n in out["privileged_localisers"]  # `self` that asked the policy reads none
                                    if ran.get(n, {}).get("resolved", "value") != "prompt"]
    return out
