"""`credo audit`: how right is each estimator's credit, and what does it cost?

Protocol (see METHODS.md, "How credit quality is judged"):
1. sample `n` held-out traces from the checkpoint (n / group_size prompts x group_size samples, so
   group-based estimators see real groups);
2. cut them into `lines` segments (one arithmetic step per segment) and compute reference MC values
   with `k_ref` continuations per boundary (cached per checkpoint / seed / n / k_ref / segmenter);
3. run every requested estimator through a fresh counted Probe, then score it per trace.
Metric definitions:
- segment credit of any estimator = mean of its per-token advantages over the segment's tokens;
- `spearman` / `pearson`: per trace, between segment credit and the reference differences
  V(s_k) - V(s_{k-1}); averaged over traces with >= 2 segments and a non-constant reference. An
  estimator whose credit is constant on a trace scores 0 there (it ranks nothing);
- `first_error_top1`: over incorrect traces whose first wrong step is one of their segments, the
  share whose most negative segment is that step; ties share the hit (1/|argmin set|), so uniform
  credit scores like a random guess;
- cost: tokens scored and generated per trace by the estimator, seconds per trace, and
  `cost_vs_grpo_step` = (tokens scored + generated) / (tokens of sampling the trace itself).
Rows `random`, `grpo` (uniform) and `first_step` (always blames step 1) are floors; `mc_reference`
is the reference itself (its fidelity is 1 by construction; its split-half agreement is reported
in the config as `reference_split_half_spearman`).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from scipy import stats

from credo import credit as credit_registry
from credo.audit_cache import load_cached, save_cached
from credo.config import check, to_dict
from credo.credit.mc import MCValues, mc_values
from credo.policy import load_policy
from credo.policy.base import SamplingConfig
from credo.probe import Probe
from credo.rollouts import Rollouts
from credo.runs import atomic_write_json, atomic_write_text, cache_root
from credo.segment import segment_means
from credo.strategies import sample_groups
from credo.tasks import make_task

METRICS = ("spearman", "pearson", "first_error_top1", "tokens_scored_per_trace", "tokens_generated_per_trace",
           "seconds_per_trace", "cost_vs_grpo_step")
FLOORS = ("random", "grpo", "first_step")
AUDIT_DEFAULTS: dict[str, dict[str, Any]] = {"vineppo": {"k": 4}}  # the cheap MC row


@dataclass(frozen=True)
class AuditConfig:
    """checkpoint: policy directory ('' = the SFT start). n: traces (n / group_size prompts).
    k_ref: continuations per boundary for the reference. methods: estimator specs, each
    'name' or 'name:key=value:key=value' (e.g. 'vineppo:k=9'). segmenter: audit segments (lines
    = one arithmetic step each, so step labels line up). max_new_tokens/temperature: sampling."""

    checkpoint: str = ""
    task: str = "arith"
    task_options: dict = field(default_factory=dict)
    n: int = 256
    group_size: int = 8
    k_ref: int = 32
    methods: tuple[str, ...] = ("vineppo",)
    localisers: tuple[str, ...] = ()
    segmenter: str = "lines"
    temperature: float = 1.0
    max_new_tokens: int = 96
    batch_size: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.n >= self.group_size >= 2, f"audit.n must be >= audit.group_size >= 2, got {self.n}/{self.group_size}")
        check(self.k_ref >= 2, f"audit.k_ref must be >= 2, got {self.k_ref}")
        from credo.resets import LOCALISERS
        for name in self.localisers:
            check(name in LOCALISERS, f"audit.localisers: unknown localiser {name!r}; available: {LOCALISERS}")


def parse_method(spec: str) -> tuple[str, str, dict[str, str]]:
    """'vineppo:k=9' -> (row label, estimator name, options)."""
    name, *options = spec.split(":")
    parsed = {}
    for item in options:
        if "=" not in item:
            raise ValueError(f"audit method {spec!r}: option {item!r} must look like key=value")
        key, value = item.split("=", 1)
        parsed[key] = value
    return spec, name, {**AUDIT_DEFAULTS.get(name, {}), **parsed}


def _weights_digest(checkpoint: str) -> str:
    h = hashlib.sha256()
    with open(os.path.join(checkpoint, "model.safetensors"), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


@dataclass
class AuditData:
    rollouts: Rollouts
    segment_ids: torch.Tensor
    reference: MCValues
    reference_cost: dict[str, float]
    trace_tokens: float  # mean prompt + completion tokens of sampling one trace


def build_reference(config: AuditConfig, checkpoint: str, progress: bool = True) -> AuditData:
    """Sample the traces and their MC reference, or load both from the cache."""
    key = hashlib.sha256(repr((_weights_digest(checkpoint), config.task, sorted(config.task_options.items()),
                               config.seed, config.n, config.group_size, config.k_ref, config.segmenter,
                               config.temperature, config.max_new_tokens)).encode()).hexdigest()[:16]
    path = os.path.join(cache_root(), "audit", key)
    task = make_task(config.task, config.task_options)
    saved = load_cached(path, task.heldout_problems(config.n // config.group_size))
    if saved is not None:
        return AuditData(**saved)
    policy = load_policy(checkpoint)
    policy.model.eval()
    sampling = SamplingConfig(config.temperature, 1.0, config.max_new_tokens)
    generator = torch.Generator().manual_seed(config.seed)
    problems = task.heldout_problems(config.n // config.group_size)
    rollouts = sample_groups(policy, task, problems, config.group_size, sampling, generator)
    with torch.no_grad():
        old, _ = policy.score(rollouts.prompt_ids, rollouts.prompt_mask, rollouts.completion_ids, rollouts.completion_mask)
    rollouts = rollouts.with_fields(old_logprobs=old)
    probe = Probe(policy, task, sampling, torch.Generator().manual_seed(config.seed + 1))
    segment_ids = probe.segment(rollouts, config.segmenter)
    rollouts = rollouts.with_fields(segment_ids=segment_ids)
    start = time.time()
    if progress:
        print(f"audit: reference MC values, k_ref={config.k_ref}, {rollouts.batch_size} traces ...", flush=True)
    reference = mc_values(probe, rollouts, segment_ids, config.k_ref, config.batch_size, progress=progress)
    spent = probe.take_cost()
    n = rollouts.batch_size
    reference_cost = {"tokens_scored_per_trace": spent.tokens_scored / n,
                      "tokens_generated_per_trace": spent.tokens_generated / n,
                      "seconds_per_trace": (time.time() - start) / n}
    trace_tokens = float((rollouts.prompt_mask.sum() + rollouts.completion_mask.sum()) / n)
    data = AuditData(rollouts, segment_ids, reference, reference_cost, trace_tokens)
    save_cached(path, rollouts, segment_ids, reference, reference_cost, trace_tokens)
    return data


def _correlation(fn: Any, a: torch.Tensor, b: torch.Tensor) -> float:
    if len(a) < 2 or float(a.std()) == 0.0:
        return 0.0
    value = fn(a.numpy(), b.numpy())[0]
    return 0.0 if math.isnan(value) else float(value)


def fidelity(segment_credit: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> tuple[float, float, int]:
    """Mean per-trace (spearman, pearson) and the number of traces scored (see module docstring)."""
    sp, pe = [], []
    for credit, ref in zip(segment_credit, reference):
        if len(ref) < 2 or float(ref.std()) == 0.0:
            continue
        sp.append(_correlation(stats.spearmanr, credit.float(), ref.float()))
        pe.append(_correlation(stats.pearsonr, credit.float(), ref.float()))
    if not sp:
        return 0.0, 0.0, 0
    return sum(sp) / len(sp), sum(pe) / len(pe), len(sp)


def first_error_top1(segment_credit: Sequence[torch.Tensor], first_errors: Sequence[int | None]) -> float:
    """Share of labelled incorrect traces whose most negative segment is the first wrong step (ties shared)."""
    hits, total = 0.0, 0
    for credit, first in zip(segment_credit, first_errors):
        if first is None or first >= len(credit):
            continue
        total += 1
        lowest = credit.min()
        argmins = (credit <= lowest + 1e-12).nonzero().flatten().tolist()
        hits += (1.0 / len(argmins)) if first in argmins else 0.0
    return hits / total if total else float("nan")


def floor_credit(name: str, reference: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if name == "random":
        return [torch.randn(len(r), generator=g) for r in reference]
    if name == "grpo":
        return [torch.zeros(len(r)) for r in reference]
    if name == "first_step":
        return [torch.cat([torch.tensor([-1.0]), torch.zeros(max(len(r) - 1, 0))])[:len(r)] for r in reference]
    raise KeyError(name)


def split_half_spearman(reference: MCValues) -> float:
    """Agreement of the reference with itself: differences from the first vs second half of its samples."""
    halves = []
    for v, s in zip(reference.values, reference.samples):
        k = s.shape[1] // 2
        a, b = v.clone(), v.clone()
        live = ~torch.isnan(s[:, 0])
        a[:-1][live] = s[live, :k].mean(1)
        b[:-1][live] = s[live, k:].mean(1)
        halves.append((a[1:] - a[:-1], b[1:] - b[:-1]))
    return fidelity([h[0] for h in halves], [h[1] for h in halves])[0]


def run_audit(config: AuditConfig, out_dir: str, progress: bool = True) -> dict[str, Any]:
    """Run the audit and write audit.json, audit.md and audit.png into out_dir."""
    checkpoint = config.checkpoint
    if not checkpoint:
        from credo.sft import ensure_sft
        checkpoint = ensure_sft(progress=progress)
    task = make_task(config.task, config.task_options)
    data = build_reference(config, checkpoint, progress)
    rollouts, segment_ids = data.rollouts, data.segment_ids
    reference = data.reference.differences()
    n = rollouts.batch_size
    first_errors = [None] * n
    if task.has_step_labels:
        first_errors = [None if bool(ok) else task.step_truth(p, text).first_error
                        for p, text, ok in zip(rollouts.problems, rollouts.completions, rollouts.correct)]
    rows: dict[str, dict[str, float]] = {}
    failures: dict[str, str] = {}

    def score(label: str, seg_credit: list[torch.Tensor], cost: dict[str, float]) -> None:
        sp, pe, _ = fidelity(seg_credit, reference)
        total = cost["tokens_scored_per_trace"] + cost["tokens_generated_per_trace"]
        rows[label] = {"spearman": sp, "pearson": pe, "first_error_top1": first_error_top1(seg_credit, first_errors),
                       "tokens_scored_per_trace": cost["tokens_scored_per_trace"],
                       "tokens_generated_per_trace": cost["tokens_generated_per_trace"],
                       "seconds_per_trace": cost["seconds_per_trace"],
                       "cost_vs_grpo_step": total / data.trace_tokens}

    zero_cost = {"tokens_scored_per_trace": 0.0, "tokens_generated_per_trace": 0.0, "seconds_per_trace": 0.0}
    for name in FLOORS:
        score(name, floor_credit(name, reference, config.seed), zero_cost)
    policy = load_policy(checkpoint)
    policy.model.eval()
    sampling = SamplingConfig(config.temperature, 1.0, config.max_new_tokens)
    for spec in config.methods:
        label, name, options = parse_method(spec)
        if label in rows:
            continue
        try:
            estimator = credit_registry.get(name)
            est_config = estimator.make_config(options)
            probe = Probe(policy, task, sampling, torch.Generator().manual_seed(config.seed + 2))
            if progress:
                print(f"audit: {label} ...", flush=True)
            start = time.time()
            result = estimator(rollouts, probe, est_config)
            seconds = time.time() - start
            seg_credit = segment_means(result.advantages, segment_ids)
            score(label, seg_credit, {"tokens_scored_per_trace": result.cost.tokens_scored / n,
                                      "tokens_generated_per_trace": result.cost.tokens_generated / n,
                                      "seconds_per_trace": seconds / n})
        except Exception as err:  # a failed method is reported, never hidden, and the audit goes on
            failures[label] = f"{type(err).__name__}: {err}"
    score("mc_reference", reference, data.reference_cost)
    rows["mc_reference"]["spearman"] = rows["mc_reference"]["pearson"] = 1.0
    labelled = sum(1 for f, r in zip(first_errors, reference) if f is not None and f < len(r))
    report = {
        "config": {**to_dict(config), "checkpoint": checkpoint, "traces": n,
                   "incorrect_with_first_error": labelled,
                   "mean_segments_per_trace": sum(len(r) for r in reference) / max(n, 1),
                   "traces_scored_for_correlation": fidelity(reference, reference)[2],
                   "reference_split_half_spearman": split_half_spearman(data.reference),
                   "random_first_error_expectation": _random_expectation(reference, first_errors),
                   "trace_tokens": data.trace_tokens, "failures": failures},
        "methods": rows,
    }
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_json(os.path.join(out_dir, "audit.json"), report)
    table = markdown_table(report)
    if config.localisers:
        loc = audit_localisers(config, rollouts, segment_ids, data.reference, first_errors, policy, task, progress)
        atomic_write_json(os.path.join(out_dir, "localisers.json"), loc)
        table += "\n" + localiser_table(loc)
    atomic_write_text(os.path.join(out_dir, "audit.md"), table)
    plot_audit(report, os.path.join(out_dir, "audit.png"))
    return report


def _random_expectation(reference: Sequence[torch.Tensor], first_errors: Sequence[int | None]) -> float:
    """Expected first_error_top1 of a uniform guess: mean of 1/(segments) over the labelled traces."""
    values = [1.0 / len(r) for r, f in zip(reference, first_errors) if f is not None and f < len(r)]
    return sum(values) / len(values) if values else float("nan")


def markdown_table(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = ["# credo audit", "",
             f"checkpoint `{cfg['checkpoint']}` · {cfg['traces']} traces ({cfg['group_size']} per prompt) · "
             f"K_ref={cfg['k_ref']} · segmenter `{cfg['segmenter']}` · "
             f"{cfg['incorrect_with_first_error']} incorrect traces with a labelled first error · "
             f"{cfg['mean_segments_per_trace']:.2f} segments per trace", "",
             f"Reference split-half Spearman: {cfg['reference_split_half_spearman']:.3f}; "
             f"a uniform guess of the first error would score {cfg['random_first_error_expectation']:.3f}.", "",
             "| method | spearman | pearson | first_error_top1 | tokens scored / trace | tokens generated / trace | s / trace | cost vs GRPO step |",
             "|---|---|---|---|---|---|---|---|"]
    for name, m in report["methods"].items():
        lines.append(f"| {name} | {m['spearman']:.3f} | {m['pearson']:.3f} | {m['first_error_top1']:.3f} | "
                     f"{m['tokens_scored_per_trace']:.0f} | {m['tokens_generated_per_trace']:.0f} | "
                     f"{m['seconds_per_trace']:.4f} | {m['cost_vs_grpo_step']:.2f} |")
    for name, why in cfg.get("failures", {}).items():
        lines.append(f"| {name} | failed: {why} | | | | | | |")
    return "\n".join(lines) + "\n"


def plot_audit(report: dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("spearman", "first_error_top1")):
        for name, m in report["methods"].items():
            x = max(m["cost_vs_grpo_step"], 1e-2)  # zero-cost floors drawn at the axis floor
            ax.scatter(x, m[metric], s=40)
            ax.annotate(name, (x, m[metric]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("cost vs sampling the trace (tokens, log scale; floors at 0.01)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0].set_title("credit fidelity vs cost")
    axes[1].set_title("first wrong step found vs cost")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def audit_localisers(config: AuditConfig, rollouts: Rollouts, segment_ids: torch.Tensor, reference: MCValues,
                     first_errors: Sequence[int | None], policy: Any, task: Any, progress: bool) -> dict[str, Any]:
    """For each localiser, on incorrect traces with a labelled first error e (a segment of the trace):
    localisation_top1 = share where it picks e; reset_success = mean reference value V(s_k) of its
    reset state (prefix = steps < k); after_error_success = mean V(s_{e+1}) (resetting just after the
    wrong step); clean_prefix_gain = their difference (the paper's "a clean prefix corrects more often")."""
    import random as _random
    from credo.resets import localise
    rows = [i for i, f in enumerate(first_errors) if f is not None and f < len(reference.values[i]) - 1]
    out: dict[str, Any] = {"traces": len(rows), "localisers": {}, "failures": {}}
    sampling = SamplingConfig(config.temperature, 1.0, config.max_new_tokens)
    for name in config.localisers:
        if progress:
            print(f"audit: localiser {name} ...", flush=True)
        probe = Probe(policy, task, sampling, torch.Generator().manual_seed(config.seed + 3))
        try:
            picks = localise(name, rollouts, rows, probe, segment_ids, _random.Random(config.seed))
        except Exception as err:
            out["failures"][name] = f"{type(err).__name__}: {err}"
            continue
        spent = probe.take_cost()
        hits = [float(k == first_errors[i]) for k, i in zip(picks, rows)]
        success = [float(reference.values[i][k]) for k, i in zip(picks, rows)]
        after = [float(reference.values[i][first_errors[i] + 1]) for i in rows]
        n = max(len(rows), 1)
        out["localisers"][name] = {
            "localisation_top1": sum(hits) / n, "reset_success": sum(success) / n,
            "after_error_success": sum(after) / n, "clean_prefix_gain": (sum(success) - sum(after)) / n,
            "tokens_scored_per_trace": spent.tokens_scored / n, "tokens_generated_per_trace": spent.tokens_generated / n,
        }
    return out


def localiser_table(loc: dict[str, Any]) -> str:
    lines = [f"## Reset localisers ({loc['traces']} incorrect traces with a labelled first error)", "",
             "| localiser | localisation_top1 | reset_success | after_error_success | clean_prefix_gain | tokens scored / trace |",
             "|---|---|---|---|---|---|"]
    for name, m in loc["localisers"].items():
        lines.append(f"| {name} | {m['localisation_top1']:.3f} | {m['reset_success']:.3f} | {m['after_error_success']:.3f} | "
                     f"{m['clean_prefix_gain']:+.3f} | {m['tokens_scored_per_trace']:.0f} |")
    for name, why in loc["failures"].items():
        lines.append(f"| {name} | failed: {why} | | | | |")
    return "\n".join(lines) + "\n"
