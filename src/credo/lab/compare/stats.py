"""The numbers a comparison is judged by: paired intervals over seeds, seeds needed, equal-update accuracy,
and each credit method paired with its `shuffled` control.

Every function is pure (lists and results.json dicts in, numbers out), so the report can be rebuilt
from a results.json alone. A comparison pairs by seed: one seed fixes the prompt order and the start,
so the per-seed difference between two methods cancels the noise they share.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from scipy import stats as scipy_stats

from credo.credit.registry import get, parse_spec

LEVEL = 0.95
POWER = 0.8  # "seeds needed": the seeds at which a rerun would resolve the observed difference 4 times in 5
MAX_SEEDS = 1000  # "seeds needed" above this is reported as "more than MAX_SEEDS"
# A step that took this many times its run's median step is assumed not to have been computing: the process
# was stopped (SIGSTOP, a paused comparison) or the machine slept. Real steps vary far less (DAPO's resampled
# steps measured <= 2x their median on arith-long); a one-off warm-up that long would also be left out.
STALL_FACTOR = 20


def stalled_seconds(cumulative_seconds: list[float]) -> tuple[float, int]:
    """(seconds, steps) a run's clock spent stalled: for each step over STALL_FACTOR x the run's median step,
    its excess over the median. cumulative_seconds is the metrics log's per-step training clock (which
    survives resumption and leaves out evaluations)."""
    steps = [b - a for a, b in zip([0.0, *cumulative_seconds], cumulative_seconds)]
    if len(steps) < 3:  # too few steps to know what a normal one takes
        return 0.0, 0
    median = statistics.median(steps)
    if median <= 0:  # a clock too coarse to tell
        return 0.0, 0
    stalls = [d - median for d in steps if d > STALL_FACTOR * median]
    return sum(stalls), len(stalls)


def half_width(sd: float, n: int, level: float = LEVEL) -> float:
    """Half-width of the t interval of a mean of n paired differences with sample sd (n >= 2)."""
    return float(scipy_stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)


def detectable(sd: float, n: int, level: float = LEVEL, power: float = POWER) -> float:
    """The smallest mean difference that n paired seeds with sample sd resolve (interval excluding 0) with
    probability `power`: (t_{level} + t_{power}) * sd / sqrt(n), both t quantiles with n - 1 degrees of freedom."""
    t = scipy_stats.t
    return float(t.ppf(0.5 + level / 2, n - 1) + t.ppf(power, n - 1)) * sd / math.sqrt(n)


def seeds_needed(mean: float, sd: float, level: float = LEVEL, cap: int = MAX_SEEDS,
                 power: float = POWER) -> int | None:
    """The fewest seeds n >= 2 at which a rerun resolves the difference (its interval excludes 0) with
    probability `power` (80%), if the true mean and the paired sd are as observed: the smallest n with
    detectable(sd, n) < |mean|. (n with only t_{n-1} * sd / sqrt(n) < |mean| resolves it half the time.)
    None when no n <= cap does (including a zero mean)."""
    if mean == 0 or math.isnan(mean):
        return None
    for n in range(2, cap + 1):
        if detectable(sd, n, level, power) < abs(mean):
            return n
    return None


def paired(deltas: list[float], level: float = LEVEL, resolution: float = 0.0) -> dict[str, Any]:
    """Mean of per-seed differences with its t interval: {n, mean, sd, ci: [low, high] | None,
    seeds_needed} (and sd_floored: True where the floor below acted). One difference has no spread, so no
    interval (ci None). `resolution`: the smallest step a difference can take (1/n for accuracies on n
    problems); the sd is floored there, since differences counted in whole problems can agree by chance, and
    a zero spread would give a zero-width interval that excludes 0 on two seeds."""
    n = len(deltas)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "ci": None, "seeds_needed": None}
    mean = statistics.mean(deltas)
    if n == 1:
        return {"n": 1, "mean": mean, "sd": None, "ci": None, "seeds_needed": None}
    sd = statistics.stdev(deltas)
    floored = sd < resolution
    sd = max(sd, resolution)
    w = half_width(sd, n, level)
    return {"n": n, "mean": mean, "sd": sd, "ci": [mean - w, mean + w], "seeds_needed": seeds_needed(mean, sd, level),
            "p": p_value(mean, sd, n), **({"sd_floored": True} if floored else {})}


def p_value(mean: float, sd: float, n: int) -> float:
    """Two-sided p of the paired t test that the mean difference is 0 (n >= 2): the p at which the t interval of
    `paired` just touches 0. A zero spread (only where no resolution floors it, e.g. GRPO against itself) has a
    zero-width interval: p is 1 on 0, else 0, as that interval says."""
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * scipy_stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family's p-values, in their order: the i-th smallest p times (k - i),
    made monotone and capped at 1. A comparison is read as resolved where its adjusted p < 1 - LEVEL; this
    controls the chance of any false verdict in the family at that level, whatever the dependence."""
    k = len(p_values)
    order = sorted(range(k), key=lambda i: p_values[i])
    adjusted, running = [0.0] * k, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (k - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def correct_family(intervals: list[dict[str, Any] | None], family: str, level: float = LEVEL) -> None:
    """Marks each interval of one family of comparisons (those with an interval: n >= 2) with the family's name
    and size, its Holm-adjusted p (`p_holm`) and its Bonferroni simultaneous interval (`ci_simultaneous`, at
    1 - (1 - level) / k: all k cover together with probability >= level). Holm decides a verdict; the
    simultaneous interval, more conservative, is the one to quote beside a row picked from the family."""
    members = [iv for iv in intervals if iv and iv.get("ci") is not None and iv.get("p") is not None]
    for iv, adjusted in zip(members, holm([iv["p"] for iv in members])):
        k = len(members)
        w = half_width(iv["sd"], iv["n"], 1 - (1 - level) / k)
        iv.update(family=family, family_size=k, p_holm=adjusted, ci_simultaneous=[iv["mean"] - w, iv["mean"] + w])


def resolved(interval: dict[str, Any] | None, direction: int, level: float = LEVEL) -> bool | None:
    """Whether a comparison is resolved in `direction` (+1 above 0, -1 below) once its family is paid for: its
    Holm-adjusted p below 1 - level and its mean on that side; None without an interval. An interval outside
    any family (`correct_family` not applied) is judged on its own p (`paired` records one with every interval)."""
    if not interval or interval.get("ci") is None:
        return None
    return interval.get("p_holm", interval["p"]) < 1 - level and interval["mean"] * direction > 0


def resolution(results: dict[str, Any], final: bool = True) -> float:
    """One problem's worth of accuracy on the comparison's final (or curve) evaluation: 1/final_eval_n (1/eval_n);
    0 when the results do not record it. Results from before the protocol block record final_eval_n at the top."""
    key = "final_eval_n" if final else "eval_n"
    n = (results.get("protocol") or {}).get(key) or results.get(key)
    return 1 / n if n else 0.0


def excludes_zero(interval: dict[str, Any], direction: int) -> bool | None:
    """Whether the interval lies wholly above 0 (direction +1) or wholly below it (-1); None without one."""
    if not interval or interval.get("ci") is None:
        return None
    low, high = interval["ci"]
    return low > 0 if direction > 0 else high < 0


def end_accuracy(curve: list[dict[str, Any]]) -> float | None:
    """A run's accuracy at its last curve evaluation after its start (normally at the end of its budget; on the
    curve's fixed problems, the final evaluation on the larger set left out); None without one. This, not the
    final accuracy, is the level tokens_to_reach looks for: the points that reach it must be scored on the same
    problems, and the final set can be easier or harder than the curve's by as much as a method's gain (on
    `smollm2-long` the first 100 held-out problems score ~4 points above the first 300 at the end of training)."""
    points = curve_points(curve)
    return points[-1]["accuracy"] if points else None


def curve_points(curve: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curve evaluations after a run's start, in order, without the final evaluation on the larger set: the
    points end_accuracy and tokens_to_reach read, all scored on the same problems."""
    return [p for p in curve if not p.get("final") and p["tokens_generated"] > 0]


def mean_end_accuracy(runs: dict[str, Any]) -> float:
    """The mean of end_accuracy over a method's runs ({seed: run}): the level the others must reach; NaN (which
    nothing reaches) when no run has a curve evaluation after its start."""
    ends = [a for r in runs.values() if (a := end_accuracy(r["curve"])) is not None]
    return statistics.mean(ends) if ends else math.nan


def tokens_to_reach(curve: list[dict[str, Any]], target: float) -> int | None:
    """Generated tokens at a run's first curve evaluation at or above `target` (its start and the final
    evaluation on the larger set left out: every point is on the same problems as end_accuracy's); None if
    never."""
    return next((p["tokens_generated"] for p in curve_points(curve) if p["accuracy"] >= target), None)


def paired_deltas(a: dict[str, Any], b: dict[str, Any], value: Any) -> list[float]:
    """value(run_a) - value(run_b) for every seed both methods finished; value(run) may be None (skipped)."""
    out = []
    for seed, run in a.items():
        if seed in b:
            x, y = value(run), value(b[seed])
            if x is not None and y is not None:
                out.append(x - y)
    return out


# --- equal policy updates ------------------------------------------------------------------------------
def accuracy_at_step(curve: list[dict[str, Any]], step: float) -> float | None:
    """Held-out accuracy after `step` policy updates, linearly interpolated between the curve's
    evaluations (the fixed eval_n set; the final evaluation on the larger set is left out so that every
    point is on the same problems). None when the run stopped before `step`."""
    points = sorted((p["step"], p["accuracy"]) for p in curve if not p.get("final") and "step" in p)
    for (s0, a0), (s1, a1) in zip(points, points[1:]):
        if s0 <= step <= s1:
            return a0 if s1 == s0 else a0 + (a1 - a0) * (step - s0) / (s1 - s0)
    if points and points[-1][0] == step:
        return points[-1][1]
    return None


def _last_step(run: dict[str, Any]) -> int | None:
    steps = [p["step"] for p in run.get("curve", []) if not p.get("final") and "step" in p]
    return max(steps) if steps else None


def grpo_first_evaluations(results: dict[str, Any]) -> list[int]:
    """The update count of GRPO's first curve evaluation after its start, one per seed (0: none)."""
    return [min((p["step"] for p in r.get("curve", []) if p.get("step", 0) > 0 and not p.get("final")), default=0)
            for r in results["methods"].get("grpo", {}).get("seeds", {}).values()]


LEVEL_REASONS = ("the fewest updates any run made", "the fewest of the runs that went past GRPO's first evaluation "
                 "on every seed (GRPO is measured there, not a line from its start)", "the fewest GRPO made")


def update_levels(results: dict[str, Any]) -> list[tuple[int, str]]:
    """(update count, why) pairs the equal-updates table reports at, ascending: the fewest updates any run
    made (every method has a value there); the fewest of the runs that went past GRPO's first evaluation
    (where a cheap method, e.g. VinePPO's few large updates, stops before GRPO was ever evaluated, the first
    count compares against a straight line, and this one is the first where GRPO is measured); the fewest
    GRPO made (the methods that got that far). Counts equal to an earlier one are left out."""
    lasts = {name: [s for r in e["seeds"].values() if (s := _last_step(r)) is not None]
             for name, e in results["methods"].items()}
    every = [s for v in lasts.values() for s in v]
    if not every or min(every) <= 0:
        return []
    firsts = grpo_first_evaluations(results)
    past_first = [s for s in every if firsts and s >= max(firsts)]
    candidates = [min(every), min(past_first) if past_first else None,
                  min(lasts["grpo"]) if lasts.get("grpo") else None]
    levels: list[tuple[int, str]] = []
    for count, why in zip(candidates, LEVEL_REASONS):
        if count is not None and (not levels or count > levels[-1][0]):
            levels.append((count, why))
    return levels


def equal_updates(results: dict[str, Any]) -> dict[str, Any]:
    """{updates: [U...], why: [reason per U], methods: {name: {str(U): {accuracy_mean, seeds, delta_vs_grpo}}}}:
    accuracy after the same number of policy updates, with the per-seed difference to GRPO's at that count. A method
    some of whose runs stopped before U has no value there (a mean over the seeds that got that far
    would favour them)."""
    chosen = update_levels(results)
    levels = [u for u, _ in chosen]
    one_problem = resolution(results, final=False)  # these accuracies are the curves' (eval_n problems)
    grpo = results["methods"].get("grpo", {}).get("seeds", {})
    table: dict[str, Any] = {}
    for name, entry in results["methods"].items():
        row = {}
        for u in levels:
            accs = [a for r in entry["seeds"].values() if (a := accuracy_at_step(r.get("curve", []), u)) is not None]
            if len(accs) < len(entry["seeds"]) or not accs:
                row[str(u)] = {"accuracy_mean": None, "seeds": len(accs), "delta_vs_grpo": None}
                continue
            deltas = paired_deltas(entry["seeds"], grpo, lambda r, u=u: accuracy_at_step(r.get("curve", []), u))
            row[str(u)] = {"accuracy_mean": statistics.mean(accs), "seeds": len(accs),
                           "delta_vs_grpo": paired(deltas, resolution=one_problem) if name != "grpo" else None}
        table[name] = row
    for u in levels:
        correct_family([row[str(u)]["delta_vs_grpo"] for row in table.values()], f"every method vs GRPO at {u} updates")
    return {"updates": levels, "why": [why for _, why in chosen], "methods": table}


# --- controls ------------------------------------------------------------------------------------------
def control_target(spec: str) -> str | None:
    """The method a `shuffled:of=<m>` control is the control of, as a spec with the options handed to it
    ('shuffled:of=tempo:options.of=rredcot:include_reference=false' -> 'tempo:of=rredcot:include_reference=false');
    None for any other method."""
    name, options = parse_spec(spec)
    if name != "shuffled":
        return None
    handed = get("shuffled").make_config(options).options  # what the wrapped method receives
    return ":".join([options["of"], *(f"{key}={value}" for key, value in handed.items())])


def control_pairs(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each control in the grid with its method: the per-seed difference of final accuracy
    (method - control) with its interval; `delta` is None when the method is not in the grid."""
    out = []
    for spec, entry in results["methods"].items():
        target = control_target(spec)
        if target is None:
            continue
        wanted = parse_spec(target)  # the method's row, whatever order its options were written in
        target = next((m for m in results["methods"] if parse_spec(m) == wanted), target)
        method = results["methods"].get(target)
        deltas = (paired_deltas(method["seeds"], entry["seeds"], lambda r: r.get("final_accuracy"))
                  if method else [])
        out.append({"method": target, "control": spec,
                    "delta": paired(deltas, resolution=resolution(results)) if method else None})
    correct_family([p["delta"] for p in out], CONTROLS_FAMILY)
    return out


VS_GRPO_FAMILY = "every method vs GRPO, final accuracy"
CONTROLS_FAMILY = "every method vs its shuffled control, final accuracy"


def clipping(grad_norms: list[float], clip: float) -> dict[str, Any]:
    """How gradient-norm clipping acted on one run: the share of its steps whose mean pre-clip gradient norm
    (`grad_norm` in metrics.jsonl, the mean over the step's updates) exceeds the clip, and the median of those
    norms. Clipping acts unequally on methods (an estimator that puts a group's advantage on a few tokens has
    a larger gradient), so a comparison reports it beside accuracy. `grad_norms` must not be empty."""
    return {"clipped_share": sum(n > clip for n in grad_norms) / len(grad_norms),
            "grad_norm_median": statistics.median(grad_norms), "grad_clip": clip}


def method_clipping(runs: dict[str, Any]) -> dict[str, Any] | None:
    """One method's clipping over its seeds: the mean of the runs' clipped shares, the median of their median
    pre-clip gradient norms and of their median update sizes after AdamW (`update_norm`; None unless every run
    recorded it); None when no run recorded gradient norms."""
    recorded = [r for r in runs.values() if r.get("clipped_share") is not None]
    if not recorded:
        return None
    updates = [r["update_norm_median"] for r in recorded if r.get("update_norm_median") is not None]
    return {"clipped_share": statistics.mean(r["clipped_share"] for r in recorded),
            "grad_norm_median": statistics.median(r["grad_norm_median"] for r in recorded),
            "grad_clip": sorted({r["grad_clip"] for r in recorded}), "runs": len(recorded),
            "update_norm_median": statistics.median(updates) if len(updates) == len(recorded) else None}


def figure(value: Any, pattern: str = "{:.3f}") -> str:
    """`value` as the report's tables print it: '—' for None or NaN (nothing measured), else `pattern`."""
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)
