"""`credo show`: look at the credit. Samples traces, runs each method, and lays the per-token credit
out as a page (`show_html.render`) or a terminal view (`render_terminal`).

A page is plain data (`Page`): for each shown trace its prompt, its segments (one step line each on
`arith`) with their tokens, the step label of each line, the labelled first error, every method's
per-token credit (advantage x weight, docs/methods.md "## How fidelity is judged") and, with
`k_ref > 0`, the MC reference value after each segment. One trace per prompt is shown (a wrong one
with a labelled first error when the group has one); the methods see the whole group, as in training.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from credo import credit as credit_registry
from credo.core.config import ConfigError, check
from credo.core.files import atomic_write_json, atomic_write_text
from credo.core.probe import Probe
from credo.core.protocols import SamplingConfig
from credo.core.segment import default_segmenter, segment_bounds, segment_means
from credo.core.terminal import escape_controls
from credo.core.values import mc_values, step_differences
from credo.lab.audit.report import checked_methods, first_error_top1, parse_method
from credo.lab.audit.run import Audited
from credo.lab.show.html import colour, render, render_audit, token_text
from credo.policy import bind_task, load_policy
from credo.policy.base import prompt_as_read
from credo.policy.device import autocast_dtype, check_device_fields, resolve_device, resolve_dtype
from credo.strategies.sampling import sample_scored
from credo.tasks import make_task
from credo.train.starts import resolve_checkpoint


@dataclass(frozen=True)
class ShowConfig:
    """What `credo show` samples and colours."""

    checkpoint: str = ""
    """A credo checkpoint, a Hugging Face model directory, smollm2-135m or a training run (its final/);
    '' or 'sft' = the task's SFT start (credo.train.starts.resolve_checkpoint)."""
    task: str = "arith"
    """Task: 'arith', 'arith-long', 'gym:<dataset>' or 'jsonl:<path>'."""
    task_options: dict = field(default_factory=dict)
    """The task's own options."""
    methods: tuple[str, ...] = ("grpo", "rredcot")
    """Estimator specs ('name' or 'name:key=value:...', as in `credo audit`)."""
    n: int = 8
    """Traces shown, one per held-out prompt."""
    group_size: int = 8
    """Samples per prompt (the group the methods see)."""
    k_ref: int = 0
    """> 0: MC reference values with k_ref continuations per boundary beside each segment."""
    segmenter: str = ""
    """The segments shown and read by every method ('' = the task's own: lines on arith, one step per line;
    keyword_entropy on free-form tasks)."""
    temperature: float = 1.0
    """Sampling temperature."""
    max_new_tokens: int = 96
    """Generation limit per completion."""
    device: str = "auto"
    """Where the model runs: auto (CUDA when torch finds a GPU, else the CPU), cpu, cuda or cuda:N (docs/gpu.md)."""
    dtype: str = "float32"
    """float32; bfloat16 (a Hugging Face model's weights, on a GPU); or bfloat16-mixed (float32 weights, matrix
    products in bfloat16 under torch.autocast: a Hugging Face model, on a CPU with AMX/AVX512-BF16 or a GPU)."""
    seed: int = 0
    """Seed of the sampled traces."""

    def __post_init__(self) -> None:
        check_device_fields(self.device, self.dtype, "show.")
        check(bool(self.methods), "show.methods must name at least one method")
        checked_methods(self.methods, where="show --methods")  # unknown estimators fail before --out is claimed
        check(1 <= self.n <= 256, f"show.n must be in 1..256, got {self.n}")
        check(2 <= self.group_size <= 64, f"show.group_size must be in 2..64, got {self.group_size}")
        check(0 <= self.k_ref <= 256, f"show.k_ref must be in 0..256, got {self.k_ref}")
        check(self.temperature > 0, f"show.temperature must be > 0, got {self.temperature}")
        check(1 <= self.max_new_tokens <= 4096, f"show.max_new_tokens must be in 1..4096, got {self.max_new_tokens}")


@dataclass
class MethodRun:
    """One method's credit on the sampled batch: credit[B, T] = advantages x weights, and its cost."""

    label: str
    credit: torch.Tensor
    cost_vs_step: float
    tokens_per_trace: float


@dataclass
class Segment:
    tokens: list[str]
    ok: bool | None                      # the step label (None: no label)
    credit: dict[str, list[float]]       # method label -> per-token credit
    ref_value: float | None = None       # V(s_k) after this segment
    ref_diff: float | None = None        # V(s_k) - V(s_{k-1})


@dataclass
class Trace:
    index: int
    prompt: str
    correct: bool
    first_error: int | None              # labelled first wrong step (0-based segment), None if none
    segments: list[Segment]


@dataclass
class Page:
    title: str
    subtitle: str
    summary: list[dict[str, Any]]         # per method: label, first_error_top1, cost_vs_step, tokens_per_trace
    methods: list[str]
    traces: list[Trace]
    scale: float                          # |credit| mapped to full colour (shared by every method)
    has_reference: bool


def pick_rows(rollouts: Any, task: Any, segment_ids: torch.Tensor, n: int) -> list[int]:
    """One row per group, in group order: its first wrong trace with a labelled first error, else its first."""
    bounds = segment_bounds(segment_ids)
    chosen: dict[int, tuple[bool, int]] = {}  # group -> (labelled, row)
    for row, group in enumerate(rollouts.group.tolist()):
        first = first_error_of(task, rollouts, row)
        labelled = first is not None and first < len(bounds[row])
        if group not in chosen or (labelled and not chosen[group][0]):
            chosen[group] = (labelled, row)
    return [row for _, row in chosen.values()][:n]


def first_error_of(task: Any, rollouts: Any, row: int) -> int | None:
    if bool(rollouts.correct[row]) or not getattr(task, "has_step_labels", False):
        return None
    return task.step_truth(rollouts.problems[row], rollouts.completions[row]).first_error


def build_page(title: str, subtitle: str, task: Any, policy: Any, rollouts: Any, segment_ids: torch.Tensor,
               rows: Sequence[int], runs: Sequence[MethodRun], reference: Sequence[torch.Tensor] | None = None,
               reference_cost: float | None = None) -> Page:
    """A Page of `rows` of `rollouts`; reference[j] = MC values V(s_0..s_K) of rows[j] (or None)."""
    bounds = segment_bounds(segment_ids)
    traces, firsts = [], []
    for j, row in enumerate(rows):
        ids = rollouts.completion_ids[row][rollouts.completion_mask[row]].tolist()
        strings = policy.token_strings(ids)
        first = first_error_of(task, rollouts, row)
        labels = (task.step_truth(rollouts.problems[row], rollouts.completions[row]).correct
                  if getattr(task, "has_step_labels", False) else ())
        segments = []
        for k, (a, b) in enumerate(bounds[row]):
            values = reference[j] if reference is not None else None
            segments.append(Segment(
                tokens=strings[a:b], ok=labels[k] if k < len(labels) else None,
                credit={r.label: r.credit[row, a:b].tolist() for r in runs},
                ref_value=float(values[k + 1]) if values is not None else None,
                ref_diff=float(values[k + 1] - values[k]) if values is not None else None))
        firsts.append(first if first is not None and first < len(segments) else None)
        shown = prompt_as_read(policy, rollouts.problems[row].prompt).user  # as the model read it (cut to fit)
        traces.append(Trace(j + 1, shown, bool(rollouts.correct[row]), firsts[-1], segments))
    row_ids = torch.tensor(list(rows), dtype=torch.long)
    summary = []
    for r in runs:
        means = segment_means(r.credit[row_ids], segment_ids[row_ids])
        summary.append({"label": r.label, "first_error_top1": first_error_top1(means, firsts),
                        "cost_vs_step": r.cost_vs_step, "tokens_per_trace": r.tokens_per_trace})
    if reference is not None:
        diffs = step_differences(reference)
        summary.append({"label": "mc_reference", "first_error_top1": first_error_top1(diffs, firsts),
                        "cost_vs_step": reference_cost, "tokens_per_trace": None})
    # no runs: an audit of baselines only (grpo is a row of its table, not a credit to colour)
    every = torch.cat([r.credit[row_ids][segment_ids[row_ids] >= 0].abs() for r in runs] or [torch.zeros(0)])
    every = every[every > 0]
    scale = float(torch.quantile(every, 0.98)) if every.numel() else 1.0
    return Page(title, subtitle, summary, [r.label for r in runs], traces, scale or 1.0, reference is not None)


def run_methods(specs: Sequence[str], rollouts: Any, policy: Any, task: Any, sampling: Any, seed: int,
                progress: bool) -> list[MethodRun]:
    """Each estimator spec on the whole batch, through a fresh counted Probe."""
    n = rollouts.batch_size
    trace_tokens = float((rollouts.prompt_mask.sum() + rollouts.completion_mask.sum()) / n)
    runs = []
    for spec in specs:
        label, name, options = parse_method(spec)
        estimator = credit_registry.get(name)
        probe = Probe(policy, task, sampling, torch.Generator().manual_seed(seed + 2))
        if progress:
            print(f"show: {label} ...", flush=True)
        result = estimator(rollouts, probe, estimator.make_config(options))
        credit = result.advantages if result.weights is None else result.advantages * result.weights
        spent = (result.cost.tokens_scored + result.cost.tokens_generated) / n
        runs.append(MethodRun(label, credit.detach().float().cpu(), spent / trace_tokens, spent))
    return runs


def collect(config: ShowConfig, progress: bool = True) -> Page:
    """Sample, score every method, and (k_ref > 0) the MC reference of the shown traces."""
    checkpoint = resolve_checkpoint(config.checkpoint, "show.checkpoint", task=config.task, progress=progress)
    task = make_task(config.task, config.task_options, prefix="show.task_options.")
    device = resolve_device(config.device, "show.device")
    policy = bind_task(load_policy(checkpoint, device=device, dtype=resolve_dtype(config.dtype, device, "show.dtype"),
                                   autocast=autocast_dtype(config.dtype)),
                       task, check_as="show.checkpoint", max_new_tokens=config.max_new_tokens)
    policy.model.eval()
    sampling = SamplingConfig(config.temperature, 1.0, config.max_new_tokens)
    rollouts = sample_scored(policy, task, task.heldout_problems(config.n), config.group_size, sampling,
                             torch.Generator().manual_seed(config.seed))
    probe = Probe(policy, task, sampling, torch.Generator().manual_seed(config.seed + 1))
    segment_ids = probe.segment(rollouts, config.segmenter or default_segmenter(task))
    rollouts = rollouts.with_fields(segment_ids=segment_ids)
    runs = run_methods(config.methods, rollouts, policy, task, sampling, config.seed, progress)
    rows = pick_rows(rollouts, task, segment_ids, config.n)
    reference, reference_cost = None, None
    if config.k_ref:
        shown = rollouts.select(rows)
        with probe.metered() as spent:
            reference = mc_values(probe, shown, segment_ids[rows], config.k_ref, progress=progress).values
        trace_tokens = float((shown.prompt_mask.sum() + shown.completion_mask.sum()) / len(rows))
        reference_cost = (spent.tokens_scored + spent.tokens_generated) / len(rows) / trace_tokens
    subtitle = (f"checkpoint {checkpoint} · task {config.task} · {len(rows)} traces (one per prompt, methods see "
                f"groups of {config.group_size}) · seed {config.seed}"
                + (f" · K_ref={config.k_ref}" if config.k_ref else ""))
    on_cpu = None if reference is None else [v.cpu() for v in reference]  # the page reads them beside runs' credit
    return build_page("credo show", subtitle, task, policy, rollouts.to("cpu"), segment_ids.cpu(), rows, runs, on_cpu,
                      reference_cost)


def write_page(page: Page, out_dir: str, name: str = "index.html") -> str:
    """Write the self-contained HTML page atomically; returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    atomic_write_text(path, render(page))
    return path


def render_terminal(page: Page, console: Any = None) -> None:
    """Coloured tokens with rich: per trace, one block per method, one line per segment. Every text from data
    or the command line (prompts, tokens, labels, paths) goes through escape_controls, and none is read as
    rich markup."""
    console = console or Console()
    console.print(Text(escape_controls(f"{page.title}: {page.subtitle}"), style="bold"))
    for row in page.summary:
        cost = "" if row["cost_vs_step"] is None else f"  cost x{row['cost_vs_step']:.2f}"
        top1 = row["first_error_top1"]  # NaN: not measured (a run's logged credit has no step labels)
        top1 = f" first-error top-1 {top1:.2f}" if top1 == top1 else ""
        console.print(escape(escape_controls(f"  {row['label']:<28}{top1}{cost}")))
    console.print(f"  colour scale: |credit| {page.scale:.3g} = full red (negative) / blue (positive)")
    for trace in page.traces:
        verdict = "correct" if trace.correct else "wrong" + (f", first error step {trace.first_error + 1}"
                                                           if trace.first_error is not None else "")
        console.print(Text(escape_controls(f"\ntrace {trace.index} ({verdict}): {trace.prompt.strip()}"),
                           style="bold"))
        for label in page.methods:
            console.print(Text(escape_controls(f" {label}"), style="italic"))
            for k, seg in enumerate(trace.segments):
                mark = " " if seg.ok is None else ("✓" if seg.ok else "✗")
                line = Text(f"  {mark}{'>' if k == trace.first_error else ' '} ")
                for tok, value in zip(seg.tokens, seg.credit[label]):
                    r, g, b = colour(value, page.scale)
                    line.append(escape_controls(token_text(tok)), style=f"black on rgb({r},{g},{b})")
                if seg.ref_value is not None:
                    line.append(f"   V={seg.ref_value:.2f} Δ{seg.ref_diff:+.2f}", style="dim")
                console.print(line)


def write_audit_page(out_dir: str, audit: Audited, n: int = 8) -> str:
    """out_dir/audit.html: the audit's tables and plot, and a show grid of `n` of its traces (one per prompt), with
    each method's credit and the reference values beside it; returns its path."""
    data = audit.data
    runs = []
    for label, result in audit.credits.items():
        credit = result.advantages if result.weights is None else result.advantages * result.weights
        spent = (result.cost.tokens_scored + result.cost.tokens_generated) / data.rollouts.batch_size
        runs.append(MethodRun(label, credit.detach().float().cpu(), spent / data.trace_tokens, spent))
    rows = pick_rows(data.rollouts, audit.task, data.segment_ids, n)
    page = build_page("credo audit", f"{len(rows)} traces, one per prompt; colours: credit = advantage x weight",
                      audit.task, audit.policy, data.rollouts, data.segment_ids, rows, runs,
                      [data.reference.values[r] for r in rows])
    path = os.path.join(out_dir, "audit.html")
    atomic_write_text(path, render_audit(audit.table, os.path.join(out_dir, "audit.png"), page))
    return path


def run_show(config: ShowConfig, out_dir: str, terminal: bool = False, progress: bool = True) -> str:
    """`credo show`: collect, write DIR/index.html (and page.json), optionally print to the terminal."""
    if os.path.exists(os.path.join(out_dir, "index.html")) and not os.path.exists(os.path.join(out_dir, "page.json")):
        raise ConfigError(f"{os.path.join(out_dir, 'index.html')} exists and was not written by credo show; "
                          "choose another --out")
    started = time.time()
    page = collect(config, progress)
    path = write_page(page, out_dir)
    atomic_write_json(os.path.join(out_dir, "page.json"), {**asdict(page), "seconds": time.time() - started})
    if terminal:
        render_terminal(page)
    return path
