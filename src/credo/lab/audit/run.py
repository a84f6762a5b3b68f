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

import math
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from credo import credit as credit_registry
from credo.core.config import to_dict
from credo.core.files import atomic_write_json, atomic_write_text
from credo.core.probe import Probe
from credo.core.protocols import SamplingConfig
from credo.core.rollouts import Rollouts
from credo.core.segment import segment_means
from credo.core.values import MCValues
from credo.lab.audit.config import AuditConfig
from credo.lab.audit.premises import (conditions_on_solution, kl_argmax_hits, parse_figures, teacher_gain,
                                      teacher_table, teacher_warning, unprivileged_twins)
from credo.lab.audit.reference import AuditData, audit_device, audited_policy, build_reference, with_task_segmenter
from credo.lab.audit.localisation import localiser_table, pick_figures
from credo.lab.audit.report import (FLOORS, Labels, checked_methods, fidelity, floor_credit, labelled_errors,
                                    localisable_errors, markdown_table, most_frequent_position,
                                    plot_audit, random_expectation, routed_rows, score_row,
                                    split_half_spearman, weight_concentration)
from credo.policy.device import device_name
from credo.strategies.localisers import LOCALISERS, localise
from credo.tasks import make_task
from credo.train.starts import resolve_checkpoint


def segment_credit_of(result: Any, segment_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per row, the mean over each segment of advantages x weights (weights None means 1)."""
    effective = result.advantages if result.weights is None else result.advantages * result.weights
    return [means.cpu() for means in segment_means(effective, segment_ids)]  # scored beside the CPU reference


@dataclass
class Audited:
    """An audit's outcome: its report (audit.json), its tables (audit.md), and what a page of its traces draws
    (credo.lab.show.view.write_audit_page): the task, the policy, the traces with their reference, and each
    method's Credit by label."""

    report: dict[str, Any]
    table: str
    task: Any
    policy: Any
    data: AuditData
    credits: dict[str, Any]


def run_audit(config: AuditConfig, out_dir: str, progress: bool = True) -> Audited:
    """Run the audit and write audit.json, audit.md and audit.png to out_dir (the command that runs it adds the
    page of its traces, audit.html)."""
    methods = unprivileged_twins(checked_methods(config.methods))  # before the (slow) reference: a typo fails at once
    checkpoint = resolve_checkpoint(config.checkpoint, "audit.checkpoint", task=config.task, progress=progress)
    task = make_task(config.task, config.task_options, prefix="audit.task_options.")
    config = with_task_segmenter(config, task)
    data = build_reference(config, checkpoint, progress)
    first, slips = labelled_errors(task, data.rollouts)
    labels = Labels(first, localisable_errors(data.reference, first), slips)
    prior = most_frequent_position(first, data.reference.differences())
    rows = floor_rows(config, data, labels, prior)
    policy = audited_policy(checkpoint, task, config, *audit_device(config))
    credits, failures = method_rows(config, methods, data, labels, policy, task, progress, rows)
    report: dict[str, Any] = {
        "config": {**to_dict(config), "checkpoint": checkpoint, "device": device_name(policy.device),
                   **reference_facts(data, labels, prior), "failures": failures,
                   "privileged_methods": [label for label, name, options in methods
                                          if credit_registry.get(name).reads_privileged(options)]},
        "methods": rows,
    }
    table = markdown_table(report) + checks(config, report, methods, data, labels, policy, task, progress)
    write_audit(out_dir, report, table)
    return Audited(report, table, task, policy, data, credits)


def floor_rows(config: AuditConfig, data: AuditData, labels: Labels, prior: int | None) -> dict[str, dict[str, float]]:
    """The floors' rows (FLOORS: credit that knows nothing, at no cost)."""
    reference = data.reference.differences()
    zero_cost = {"tokens_scored_per_trace": 0.0, "tokens_generated_per_trace": 0.0, "seconds_per_trace": 0.0}
    return {name: score_row(floor_credit(name, reference, config.seed, prior), reference, labels, zero_cost,
                            data.trace_tokens) for name in FLOORS}


def method_rows(config: AuditConfig, methods: list[tuple[str, str, Any]], data: AuditData, labels: Labels,
                policy: Any, task: Any, progress: bool, rows: dict[str, dict[str, float]]
                ) -> tuple[dict[str, Any], dict[str, str]]:
    """Each method's row into `rows`, then the routed rows and the reference's own; (each method's Credit by label,
    the methods that failed)."""
    reference = data.reference.differences()
    on_device, segments_on_device = data.rollouts.to(policy.device), data.segment_ids.to(policy.device)

    def record(label: str, credit: list[torch.Tensor], cost: dict[str, float]) -> None:
        rows[label] = score_row(credit, reference, labels, cost, data.trace_tokens)

    credits: dict[str, Any] = {}  # label -> Credit, for the page of the audit's traces
    failures = score_methods(config, methods, on_device, segments_on_device, policy, task, progress, record, credits)
    rows.update(routed_rows(methods, {label: segment_credit_of(c, segments_on_device) for label, c in credits.items()},
                            rows, on_device, reference, labels, data.trace_tokens))
    rows["mc_reference"] = score_row(reference, reference, labels, data.reference_cost, data.trace_tokens)
    return credits, failures


def reference_facts(data: AuditData, labels: Labels, prior: int | None) -> dict[str, Any]:
    """What audit.json's config records of the traces and their reference (its reliability, the ceiling it sets)."""
    reference, first, n = data.reference.differences(), labels.first, data.rollouts.batch_size
    split_half = split_half_spearman(data.reference)
    reliability = 2 * split_half / (1 + split_half) if split_half > -1 else float("nan")
    return {"traces": n,
            "incorrect_with_first_error": sum(1 for f, r in zip(first, reference) if f is not None and f < len(r)),
            "localisable_traces": sum(f is not None for f in labels.localisable),
            "position_prior_step": prior,
            "mean_segments_per_trace": sum(len(r) for r in reference) / max(n, 1),
            "traces_scored_for_correlation": fidelity(reference, reference)[2],
            "reference_split_half_spearman": split_half,
            "reference_reliability_spearman_brown": reliability,
            "spearman_ceiling": math.sqrt(reliability) if reliability >= 0 else float("nan"),
            "random_first_error_expectation": random_expectation(reference, first),
            "trace_tokens": data.trace_tokens}


def checks(config: AuditConfig, report: dict[str, Any], methods: list[tuple[str, str, Any]], data: AuditData,
           labels: Labels, policy: Any, task: Any, progress: bool) -> str:
    """The teacher premise check (when a method conditions on the solution) and the localisers' scores, added to
    `report`; their tables."""
    table = ""
    if any(conditions_on_solution(name, options) for _, name, options in methods):
        report["premises"] = {"teacher": check_teacher(config, data.rollouts, data.segment_ids, labels.first, policy,
                                                       task, progress)}
        table += "\n" + teacher_table(report["premises"]["teacher"])
    if config.localisers:
        on_device, segments_on_device = data.rollouts.to(policy.device), data.segment_ids.to(policy.device)
        report["localisers"] = audit_localisers(config, on_device, segments_on_device, data.reference, labels, policy,
                                                task, progress)
        table += "\n" + localiser_table(report["localisers"])
    return table


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
    V(s_{e+1}); clean_prefix_gain = their difference (the paper's "a clean prefix corrects more often"); as
    SRPO uses it, the share of resets at each step and top-1 by the first error's position and kind
    (pick_figures)."""
    first, slips = labels.first, labels.slips
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
                picks = localise(name, rollouts, rows, probe, segment_ids, random.Random(config.seed), notes=notes,
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
            **pick_figures(picks, [first[i] for i in rows], [slips[i] for i in rows])}
    ran = out["localisers"]
    out["privileged_localisers"] = [n for n in out["privileged_localisers"]  # `self` that asked the policy reads none
                                    if ran.get(n, {}).get("resolved", "value") != "prompt"]
    return out
