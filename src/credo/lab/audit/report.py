"""The report side of `credo audit`: scoring segment credit against the reference (pure functions of
credit, reference values and step labels; the metric definitions are in credo.lab.audit.run's docstring and
docs/methods.md, "## How fidelity is judged"), and the table and plot written next to audit.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from scipy import stats

from credo import credit as credit_registry
from credo.core.config import ConfigError
from credo.credit.registry import parse_spec
from credo.core.values import MCValues, step_differences
from credo.credit.sc_grpo import weighted_group_rows
from credo.lab.figures import save_figure

METRICS = ("spearman", "pearson", "first_error_top1", "pairwise", "spearman_localisable",
           "first_error_top1_localisable", "pairwise_localisable", "tokens_scored_per_trace",
           "tokens_generated_per_trace", "seconds_per_trace", "cost_vs_grpo_step", "weight_gini",
           "effective_token_ratio")
FLOORS = ("random", "grpo", "first_step", "position_prior")
LOCALISABLE_DROP = 0.15  # reference value drop at the labelled error that makes a trace localisable
TIE = 1e-6  # segment means of a constant credit differ by float32 rounding: treat them as ties
AUDIT_DEFAULTS: dict[str, dict[str, Any]] = {"vineppo": {"k": 4, "whiten": False}}  # the cheap MC row, raw differences


def parse_method(spec: str) -> tuple[str, str, dict[str, str]]:
    """'vineppo:k=9' -> (row label, estimator name, options with the audit's defaults under them); the
    audit's rows and `credo show`'s columns are named and configured alike."""
    try:
        name, parsed = parse_spec(spec)
    except ValueError as err:
        raise ConfigError(f"audit {err}") from None
    # a shuffled control wraps its method as the audit configures it (vineppo's cheap K), so control and
    # method differ only in the permutation
    wrapped = parsed.get("of") if name == "shuffled" else name
    return spec, name, {**AUDIT_DEFAULTS.get(wrapped, {}), **parsed}


def checked_methods(specs: Sequence[str], where: str = "audit --methods") -> list[tuple[str, str, Any]]:
    """(label, estimator name, config) of every spec; an unknown estimator or option is a one-line
    ConfigError naming it (`audit --methods ...`, or `where`), raised before any sampling starts."""
    out = []
    for spec in specs:
        try:
            label, name, options = parse_method(spec)
            estimator = credit_registry.get(name)
        except ValueError as err:
            raise ConfigError(f"{where}: {err.args[0] if err.args else err}") from None
        out.append((label, name, estimator.make_config(options, prefix=f"{where} {name}:")))
    return out


def _correlation(fn: Any, a: torch.Tensor, b: torch.Tensor) -> float:
    """fn's correlation of a and b; 0 when a is constant up to TIE (it ranks nothing)."""
    if len(a) < 2 or float(a.max() - a.min()) <= TIE:
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
        argmins = (credit <= credit.min() + TIE).nonzero().flatten().tolist()
        hits += (1.0 / len(argmins)) if first in argmins else 0.0
    return hits / total if total else float("nan")


def pairwise_rank(segment_credit: Sequence[torch.Tensor], first_errors: Sequence[int | None]) -> float:
    """Share of (first wrong step e, earlier correct step j < e) pairs, pooled over the labelled
    traces, where e gets less credit than j (ties within TIE count 1/2)."""
    wins, pairs = 0.0, 0
    for credit, first in zip(segment_credit, first_errors):
        if first is None or first >= len(credit):
            continue
        for j in range(first):
            pairs += 1
            gap = float(credit[j] - credit[first])
            wins += 1.0 if gap > TIE else 0.5 if gap >= -TIE else 0.0
    return wins / pairs if pairs else float("nan")


def localisable_errors(reference: MCValues, first_errors: Sequence[int | None]) -> list[int | None]:
    """first_errors kept only where the reference value drops by >= LOCALISABLE_DROP at the error."""
    out: list[int | None] = []
    for v, first in zip(reference.values, first_errors):
        ok = first is not None and first + 1 < len(v) and float(v[first] - v[first + 1]) >= LOCALISABLE_DROP
        out.append(first if ok else None)
    return out


def labelled_errors(task: Any, rollouts: Any) -> tuple[list[int | None], list[str | None]]:
    """Each trace's labelled first wrong step and its kind (StepTruth.first_slip: result, operand, carry, ...),
    from one step truth per wrong trace: (first, slips), each None for a right trace, and for every trace of a
    task without step labels (the kind also where the task does not tell it)."""
    if not task.has_step_labels:
        return [None] * rollouts.batch_size, [None] * rollouts.batch_size
    truths = [None if bool(ok) else task.step_truth(p, text)
              for p, text, ok in zip(rollouts.problems, rollouts.completions, rollouts.correct)]
    return ([None if t is None else t.first_error for t in truths],
            [None if t is None else t.first_slip for t in truths])


def most_frequent_position(first_errors: Sequence[int | None], reference: Sequence[torch.Tensor]) -> int:
    """The most frequent labelled first-error position (the position prior; the earliest on ties)."""
    seen = [f for f, r in zip(first_errors, reference) if f is not None and f < len(r)]
    return min(set(seen), key=lambda p: (-seen.count(p), p)) if seen else 0


def floor_credit(name: str, reference: Sequence[torch.Tensor], seed: int, prior: int = 0) -> list[torch.Tensor]:
    """Credit of a floor: random, grpo (uniform), first_step, position_prior (blames step `prior`)."""
    g = torch.Generator().manual_seed(seed)
    if name == "random":
        return [torch.randn(len(r), generator=g) for r in reference]
    if name == "grpo":
        return [torch.zeros(len(r)) for r in reference]
    if name in ("first_step", "position_prior"):
        step = 0 if name == "first_step" else prior
        return [-(torch.arange(len(r)) == min(step, len(r) - 1)).float() for r in reference]
    raise KeyError(name)


def split_half_differences(reference: MCValues) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per trace, the value differences[S] from the first and from the second half of the reference's samples."""
    halves = []
    for v, s in zip(reference.values, reference.samples):
        k = s.shape[1] // 2
        a, b = v.clone(), v.clone()
        live = ~torch.isnan(s[:, 0])
        a[:-1][live] = s[live, :k].mean(1)
        b[:-1][live] = s[live, k:].mean(1)
        halves.append(tuple(step_differences([a, b])))
    return halves


def split_half_spearman(reference: MCValues) -> float:
    """Agreement of the reference with itself: differences from the first vs second half of its samples."""
    halves = split_half_differences(reference)
    return fidelity([h[0] for h in halves], [h[1] for h in halves])[0]


@dataclass
class Labels:
    """first: labelled first wrong step per row (None for correct or unlabelled rows); localisable:
    the same where the reference drops by >= LOCALISABLE_DROP there; slips: the first error's kind per row
    (labelled_errors; None where it is not known)."""

    first: list[int | None]
    localisable: list[int | None]
    slips: list[str | None]


def weight_concentration(weights: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
    """How concentrated a method's token weights[B, T] are over the trainable tokens mask[B, T], pooled over
    the audited batch (ARCA's diagnostics): `weight_gini`, the Gini coefficient of |w| (0: uniform, -> 1: all
    weight on one token), and `effective_token_ratio` = (sum |w|)^2 / (N sum w^2), the effective number of
    tokens over N (1: uniform; q for a 0/1 mask keeping a share q). NaN for a method without token weights
    (weights None) and where every weight is 0."""
    nan = {"weight_gini": math.nan, "effective_token_ratio": math.nan}
    if weights is None:
        return nan
    w = weights[mask.bool().to(weights.device)].abs().double().flatten().cpu()  # a GPU audit's weights too
    total = float(w.sum())
    if w.numel() == 0 or total <= 0:
        return nan
    n = w.numel()
    ranks = torch.arange(1, n + 1, dtype=torch.float64)
    gini = float(2 * (ranks * torch.sort(w).values).sum() / (n * total) - (n + 1) / n)
    return {"weight_gini": gini, "effective_token_ratio": total ** 2 / (n * float((w ** 2).sum()))}


def score_row(credit: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], labels: Labels,
              cost: dict[str, float], trace_tokens: float) -> dict[str, float]:
    """Every METRICS figure of one row of segment credit; `cost` holds its cost figures and, for a method
    with token weights, its weight_concentration (NaN otherwise)."""
    sp, pe, _ = fidelity(credit, reference)
    keep = [f is not None for f in labels.localisable]
    sp_loc = fidelity([c for c, k in zip(credit, keep) if k], [r for r, k in zip(reference, keep) if k])[0]
    return {"spearman": sp, "pearson": pe, "first_error_top1": first_error_top1(credit, labels.first),
            "pairwise": pairwise_rank(credit, labels.first), "spearman_localisable": sp_loc,
            "first_error_top1_localisable": first_error_top1(credit, labels.localisable),
            "pairwise_localisable": pairwise_rank(credit, labels.localisable),
            **weight_concentration(None, torch.zeros(0)), **cost,
            "cost_vs_grpo_step": (cost["tokens_scored_per_trace"] + cost["tokens_generated_per_trace"]) / trace_tokens}


ROUTED = " · routed rows"
"""Suffix of an audit row scored on the rows a routing estimator weights (SC-GRPO: groups with 2 <= n_c < G)."""


def routed_rows(methods: list[tuple[str, str, Any]], credits: dict[str, list[torch.Tensor]],
                rows: dict[str, dict[str, float]], rollouts: Any, reference: Sequence[torch.Tensor], labels: Labels,
                trace_tokens: float) -> dict[str, dict[str, float]]:
    """SC-GRPO's credit scored again on the rows it weights only, with `routed_share` (those rows' share of the
    traces) and `routed_share_labelled` (of the wrong traces with a labelled first error): the other rows get
    GRPO's or the diversity term's row-constant credit by design, and blended in they say how often SC-GRPO
    routes, not whether its weights locate the error. credits: each method's segment credit, by label."""
    out = {}
    for label, name, options in methods:
        if name != "sc_grpo" or label not in credits:
            continue
        keep = weighted_group_rows(rollouts, options.single_correct)
        credit = credits[label]
        sub = Labels(*([column[i] for i in keep] for column in (labels.first, labels.localisable, labels.slips)))
        cost = {k: rows[label][k] for k in ("tokens_scored_per_trace", "tokens_generated_per_trace",
                                            "seconds_per_trace")}
        row = score_row([credit[i] for i in keep], [reference[i] for i in keep], sub, cost, trace_tokens)
        labelled = [i for i, f in enumerate(labels.first) if f is not None]
        out[label + ROUTED] = {**row, "routed_share": len(keep) / max(len(labels.first), 1),
                               "routed_share_labelled": (sum(i in set(keep) for i in labelled) / len(labelled)
                                                         if labelled else float("nan"))}
    return out


def random_expectation(reference: Sequence[torch.Tensor], first_errors: Sequence[int | None]) -> float:
    """Expected first_error_top1 of a uniform guess: mean of 1/(segments) over the labelled traces."""
    values = [1.0 / len(r) for r, f in zip(reference, first_errors) if f is not None and f < len(r)]
    return sum(values) / len(values) if values else float("nan")


def markdown_table(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = ["# credo audit", "",
             f"checkpoint `{cfg['checkpoint']}` · {cfg['traces']} traces ({cfg['group_size']} per prompt) · "
             f"K_ref={cfg['k_ref']} · segmenter `{cfg['segmenter']}` · "
             f"{cfg['incorrect_with_first_error']} incorrect traces with a labelled first error, "
             f"{cfg['localisable_traces']} of them localisable (reference drop >= {LOCALISABLE_DROP} at the error) · "
             f"{cfg['mean_segments_per_trace']:.2f} segments per trace", "",
             f"Reference reliability: split-half Spearman {cfg['reference_split_half_spearman']:.3f}, "
             f"Spearman-Brown {cfg['reference_reliability_spearman_brown']:.3f} (a perfect estimator's expected "
             f"Spearman, the ceiling: {cfg['spearman_ceiling']:.3f}). Floors: a uniform guess of the first error "
             f"scores {cfg['random_first_error_expectation']:.3f}; the position prior (always step "
             f"{cfg['position_prior_step'] + 1}) is the `position_prior` row. `loc` = on localisable traces; "
             "`pairwise` = share of (first wrong step, earlier correct step) pairs ranked right.", "",
             "| method | spearman | spearman loc | pairwise | pairwise loc | first_error_top1 | top1 loc | "
             "tokens scored / trace | tokens generated / trace | s / trace | cost vs GRPO step | weight Gini | "
             "effective-token ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    privileged = set(cfg.get("privileged_methods", ()))
    for name, m in report["methods"].items():
        mark = " †" if name in privileged else ""
        if "routed_share" in m:  # routed_rows: the rows a routing estimator weights, and their share
            mark += (f" ({100 * m['routed_share']:.0f}% of traces, {table_figure(m['routed_share_labelled'])} of the "
                     "labelled wrong ones)")
        lines.append(f"| {name}{mark} | {m['spearman']:.3f} | {m['spearman_localisable']:.3f} | {m['pairwise']:.3f} | "
                     f"{m['pairwise_localisable']:.3f} | {m['first_error_top1']:.3f} | "
                     f"{m['first_error_top1_localisable']:.3f} | {m['tokens_scored_per_trace']:.0f} | "
                     f"{m['tokens_generated_per_trace']:.0f} | {m['seconds_per_trace']:.4f} | "
                     f"{m['cost_vs_grpo_step']:.2f} | {table_figure(m.get('weight_gini'))} | "
                     f"{table_figure(m.get('effective_token_ratio'))} |")
    for name, why in cfg.get("failures", {}).items():
        lines.append(f"| {name} | failed: {why} |" + " |" * 12)
    if privileged:
        lines += ["",
                  "† privileged: reads the task's reference solution, step labels or gold answer beyond the reward. "
                  "Weight Gini and effective-token ratio: of the token weights of methods that have them "
                  "(— otherwise)."]
    return "\n".join(lines) + "\n"


def table_figure(value: float | None) -> str:
    """A table cell: 3 decimals, or — where the figure is undefined (NaN) or absent."""
    return "—" if value is None or math.isnan(value) else f"{value:.3f}"


COST_FLOOR = 1e-2
"""Zero-cost rows (the floors) are drawn at this cost: the cost axis is logarithmic."""


def plot_audit(report: dict[str, Any], path: str) -> None:
    """audit.png: each method's spearman and first_error_top1 against its cost. A metric that is undefined
    (NaN) for a method is not drawn; a panel with no defined point (first_error_top1 on a task without step
    labels, e.g. jsonl) says so instead of crashing the log-scaled axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    privileged = set(report.get("config", {}).get("privileged_methods", ()))
    for ax, metric in zip(axes, ("spearman", "first_error_top1")):
        points = [(name, max(m["cost_vs_grpo_step"], COST_FLOOR), m[metric]) for name, m in report["methods"].items()
                  if math.isfinite(m["cost_vs_grpo_step"]) and math.isfinite(m[metric])]
        for name, x, y in points:
            ax.scatter(x, y, s=40)
            ax.annotate(name + (" †" if name in privileged else ""), (x, y), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
        ax.set_xscale("log")
        if not points:  # a log axis with no data has no limits to draw ticks from: give it some
            ax.set_xlim(COST_FLOOR, 10)
            ax.text(0.5, 0.5, f"{metric} is undefined for every method here\n(no labelled first errors)"
                    if metric.startswith("first_error") else f"{metric} is undefined for every method here",
                    ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(f"cost vs sampling the trace (tokens, log scale; floors at {COST_FLOOR})")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0].set_title("credit fidelity vs cost")
    axes[1].set_title("first wrong step found vs cost")
    if privileged:
        fig.text(0.01, 0.01, "† privileged: reads the reference solution, step labels or gold answer", fontsize=8)
    fig.tight_layout(rect=(0, 0.04 if privileged else 0, 1, 1))
    save_figure(fig, path)
    plt.close(fig)
