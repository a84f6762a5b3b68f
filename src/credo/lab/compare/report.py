"""What a comparison's numbers say: per-method summaries, the goal checks and report.md.

Everything here is a pure function of results.json's content, so a finished comparison's report can be
rebuilt without training (`credo compare --report-only`). The statistics live in compare_stats.py, the
plots in compare_plots.py.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from credo.train import methods as method_registry
from credo.core.config import ConfigError
from credo.credit.registry import parse_spec
from credo.lab.compare.eta import describe
from credo.lab.compare.premise_report import premise_lines
from credo.lab.compare.provenance_report import commit_lines, machine_lines
from credo.lab.compare.unequal import unequal_lines, unequal_reading
from credo.train.provenance import short
from credo.lab.compare.goals import (corrected, goals, points, points_corrected, privilege_mark,
                                     unprivileged, vs_strongest_baseline)
from credo.lab.compare.stats import (MAX_SEEDS, POWER, STALL_FACTOR, VS_GRPO_FAMILY, control_pairs,
                                     correct_family, equal_updates, figure, grpo_first_evaluations,
                                     mean_end_accuracy, method_clipping, paired, paired_deltas, resolution,
                                     tokens_to_reach)


def summarise(results: dict[str, Any]) -> None:
    """Adds to each method: mean/std of finals, the paired difference to GRPO with its interval and the
    seeds needed to resolve it, tokens-to-GRPO's-end-accuracy and step-time ratios; and to the results the
    equal-updates table and the control pairs."""
    grpo = results["methods"].get("grpo", {}).get("seeds", {})
    target = mean_end_accuracy(grpo)
    # GRPO's own tokens to its mean end accuracy, counted as every method's are (first evaluation at or above it)
    crossed = [t for r in grpo.values() if (t := tokens_to_reach(r["curve"], target))]
    grpo_tokens = statistics.mean(crossed) if crossed else None
    grpo_step = statistics.mean([r["seconds_per_step"] for r in grpo.values()]) if grpo else math.nan
    results["grpo_end_target"] = target
    # no run can be seen to reach anything before its first evaluation: the smallest ratio one can measure
    firsts = [min((p["tokens_generated"] for p in r["curve"] if p["tokens_generated"] > 0), default=None)
              for e in results["methods"].values() for r in e["seeds"].values()]
    firsts = [f for f in firsts if f]
    results["tokens_ratio_floor"] = min(firsts) / grpo_tokens if firsts and grpo_tokens else None
    for name, entry in results["methods"].items():
        entry["privileged"] = reads_privileged(name)
        runs = entry["seeds"]
        finals = [r["final_accuracy"] for r in runs.values()]
        for r in runs.values():
            r["tokens_to_grpo_end"] = tokens_to_reach(r["curve"], target)
        reached = [r["tokens_to_grpo_end"] for r in runs.values() if r["tokens_to_grpo_end"]]
        entry["final_mean"] = statistics.mean(finals) if finals else None
        entry["final_std"] = statistics.stdev(finals) if len(finals) > 1 else 0.0 if finals else None
        # paired by seed: a seed fixes the prompt order, so the difference cancels part of the prompt noise
        # GRPO against itself is exactly 0 on every seed (no floor: nothing was measured twice)
        delta = paired(paired_deltas(runs, grpo, lambda r: r["final_accuracy"]),
                       resolution=resolution(results) if name != "grpo" else 0.0)
        entry["delta_vs_grpo"] = delta
        entry["delta_vs_grpo_mean"] = delta["mean"]
        entry["delta_vs_grpo_std"] = delta["sd"] if delta["n"] > 1 else 0.0 if delta["n"] else None
        entry["seeds_reaching_grpo_end"] = len(reached)
        # the mean over the seeds that got there (`seeds_reaching_grpo_end` says how many) ÷ GRPO's own
        entry["tokens_to_grpo_end_ratio"] = (statistics.mean(reached) / grpo_tokens if reached
                                               and grpo_tokens else None)
        entry["tokens_used"] = statistics.mean([r["tokens_generated"] for r in runs.values()]) if runs else None
        entry["step_time_ratio"] = (statistics.mean([r["seconds_per_step"] for r in runs.values()]) / grpo_step
                                    if runs and grpo_step == grpo_step else None)
        # the same ratio seed by seed: runs share the machine with other work, and this shows how much that moved it
        per_seed = [r["seconds_per_step"] / grpo[s]["seconds_per_step"] for s, r in runs.items()
                    if s in grpo and grpo[s].get("seconds_per_step")]
        entry["step_time_ratio_range"] = [min(per_seed), max(per_seed)] if per_seed else None
        if (clipped := method_clipping(runs)) is not None:  # runs from before grad_norm was read: no key
            entry["clipping"] = clipped
    correct_family([e["delta_vs_grpo"] for name, e in results["methods"].items() if name != "grpo"], VS_GRPO_FAMILY)
    results["equal_updates"] = equal_updates(results)
    results["controls"] = control_pairs(results)
    results["vs_strongest_baseline"] = vs_strongest_baseline(results)


def _seeds_needed(interval: dict[str, Any] | None) -> str:
    if not interval or interval.get("n", 0) < 2:
        return "—"
    if interval["mean"] == 0:
        return "never (Δ = 0)"
    return str(interval["seeds_needed"]) if interval["seeds_needed"] else f"> {MAX_SEEDS}"


def _audit_row(results: dict[str, Any], name: str) -> dict[str, Any]:
    audit = results.get("audit", {}).get("methods", {})
    if name in audit:  # a spec with options ('shuffled:of=rredcot') is its own audit row
        return audit[name]
    try:
        row = method_registry.credit_spec(name)  # 'dapo:of=rredcot' trains with rredcot's credit
    except (ConfigError, KeyError, ValueError):  # a method this version no longer knows: no row to match
        return {}
    if row in audit:
        return audit[row]
    estimator = parse_spec(row)[0]
    # a recipe on GRPO advantages (dapo, gspo, rrpo, srpo) has no credit of its own to audit
    return audit.get(estimator, {}) if (estimator != "grpo" or name == "grpo") else {}


def _updates(entry: dict[str, Any]) -> str:
    steps = sorted(r["steps"] for r in entry["seeds"].values() if "steps" in r)
    return "—" if not steps else str(steps[0]) if steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"


def reads_privileged(method: str) -> bool | None:
    """Whether `method` reads the task's reference solution, step labels or gold answer beyond the reward
    (credo.train.methods.privileged); None for a method this version no longer knows (unknown, so it is never
    taken for an unprivileged row)."""
    try:
        return method_registry.privileged(method)
    except (ConfigError, KeyError, ValueError):
        return None


def shown_name(results: dict[str, Any], name: str) -> str:
    """A method's name as the tables show it: marked † when it reads privileged task data, †? when this version
    cannot tell (a method it no longer knows)."""
    mark = privilege_mark(results["methods"].get(name, {}).get("privileged", False))
    return f"{name} {mark}" if mark else name


PRIVILEGED_NOTE = ("† privileged: reads the task's reference solution, step labels or gold answer beyond the reward "
                   "(`credo methods`), which a deployed trainer does not have; its row answers a claim only about a "
                   "method that reads the same, and only beside the unprivileged row it is compared with.")


UNKNOWN_NOTE = ("†? a method this version of credo no longer knows: whether it reads privileged data cannot be "
                "told, so its row answers no claim about methods that do not.")


def main_table(results: dict[str, Any]) -> list[str]:
    family = [e["delta_vs_grpo"].get("family_size") for n, e in results["methods"].items()
              if n != "grpo" and e.get("delta_vs_grpo") and e["delta_vs_grpo"].get("family_size")]
    lines = ["| method | final accuracy (mean ± std) | Δ vs GRPO, points [95% interval], paired by seed "
             f"| corrected for the {family[0] if family else 0} comparisons with GRPO: Holm-adjusted p; "
             "simultaneous 95% interval (Bonferroni) "
             f"| seeds to resolve Δ ({100 * POWER:.0f}% power) | tokens to GRPO's end accuracy (GRPO's mean at "
             "its last curve evaluation; the mean over the seeds reaching it ÷ GRPO's; seeds reaching) "
             "| tokens used | updates in budget | step time (× GRPO; per-seed range) | audit spearman "
             "| audit first_error_top1 | audit cost (× trace) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in results["methods"].items():
        a = _audit_row(results, name)
        n = len(entry["seeds"])
        fixed = "—" if name == "grpo" else corrected(entry.get("delta_vs_grpo"))
        if entry.get("final_mean") is None:
            final, delta, needed, reach, fixed = "failed", "—", "—", "—", "—"
        else:
            final = f"{entry['final_mean']:.3f} ± {entry['final_std']:.3f} ({n} seed{'s' if n != 1 else ''})"
            delta = "—" if name == "grpo" else points(entry.get("delta_vs_grpo"))
            needed = "—" if name == "grpo" else _seeds_needed(entry.get("delta_vs_grpo"))
            reach = (f"{figure(entry.get('tokens_to_grpo_end_ratio'), '{:.2f}')} "
                     f"({entry['seeds_reaching_grpo_end']}/{n})")
        spread = entry.get("step_time_ratio_range")
        step = figure(entry.get("step_time_ratio"), "{:.2f}") + (
            f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread and name != "grpo" and len(entry["seeds"]) > 1 else "")
        used = figure(entry.get("tokens_used"), "{:,.0f}")
        lines.append(f"| {shown_name(results, name)} | {final} | {delta} | {fixed} | {needed} | {reach} | {used} | "
                     f"{_updates(entry)} | {step} | "
                     f"{figure(a.get('spearman'))} | {figure(a.get('first_error_top1'))} | "
                     f"{figure(a.get('cost_vs_grpo_step'), '{:.2f}')} |")
    for run, why in results["failures"].items():
        lines.append(f"| {run} | failed: {why} | | | | | | | | | | |")
    if any(entry.get("privileged") for entry in results["methods"].values()):
        lines += ["", PRIVILEGED_NOTE]
    if any(entry.get("privileged", False) is None for entry in results["methods"].values()):
        lines += ["", UNKNOWN_NOTE]
    return lines


def lora_line(lora: dict[str, Any]) -> str:
    """The protocol's LoRA clause: what every run trained instead of every weight."""
    return (f" · every run trains LoRA adapters alike (rank {lora['r']}, alpha {lora['alpha']:g}, dropout "
            f"{lora['dropout']:g}, on {', '.join(lora['target_modules'])})")


def protocol_lines(results: dict[str, Any]) -> list[str]:
    """The schedule every method trained with, and the evaluation protocol."""
    protocol = results.get("protocol")
    if not protocol:
        return ["Schedule and evaluation protocol: not recorded (this comparison predates `protocol` in results.json)."]
    shared = protocol["schedule"]
    split = ("validation (training-split problems no run trained on; the held-out set not looked at)"
             if protocol.get("eval_split") == "validation" else "held-out")
    lines = [f"Task `{protocol['task']}` · seeds {', '.join(map(str, protocol['seeds']))} · "
             f"{protocol['jobs']} job(s) at once · curve: greedy accuracy on the first {protocol['eval_n']} {split} "
             f"problems (the same set at every evaluation) every {protocol['eval_every_tokens']:,} generated tokens · "
             f"final: the first {protocol['final_eval_n']} {split.split(' (')[0]} problems"
             + (f" · every run in dtype `{protocol['dtype']}`" if "dtype" in protocol else "")
             + (lora_line(protocol["lora"]) if "lora" in protocol else "") + ".", "",
             f"Schedule: every method {shared['epochs']} epoch(s) × {shared['minibatches']} mini-batch(es) per batch "
             f"(AdamW), lr {shared['lr']:g}"
             + (f", gradient-norm clip {shared['grad_clip']:g}" if "grad_clip" in shared else "")
             + ", unless listed here:"]
    own = {m: s for m, s in protocol["methods"].items() if s["source"] != "shared"}
    if not own:
        return lines[:-1] + [lines[-1].replace(", unless listed here:", " (one schedule for all).")]
    lines += ["", "| method | epochs × mini-batches | lr | why |", "|---|---|---|---|"]
    lines += [f"| {m} | {s['epochs']} × {s['minibatches']} | {s['lr']:g} | its recipe's own setting |"
              for m, s in own.items()]
    return lines


def equal_updates_lines(results: dict[str, Any]) -> list[str]:
    table = results.get("equal_updates") or {}
    levels = table.get("updates", [])
    if not levels:
        return []
    head = " | ".join(f"accuracy at {u} updates | Δ vs GRPO at {u}" for u in levels)
    lines = ["## At equal policy updates", "",
             "Curve accuracy (the fixed eval set) after the same number of policy updates, interpolated linearly "
             "between the two evaluations around that count (evaluations come every so many generated tokens, so a "
             "cheap method's are many updates apart and its value there is only indicative); Δ in points, paired by "
             "seed, [95% interval], with the Holm-adjusted p and the simultaneous interval for the family of every "
             "method against GRPO at that count. "
             + "; ".join(f"{u} is {why}" for u, why in zip(levels, table["why"]))
             + (" (— where a run of the method stopped earlier)." if len(levels) > 1 else ".")
             + _interpolated_from_start(results, levels), "",
             f"| method | {head} |", "|---|" + "---|---|" * len(levels)]
    for name, row in table["methods"].items():
        cells = []
        for u in levels:
            cell = row.get(str(u), {})
            cells += [figure(cell.get("accuracy_mean")),
                      "—" if name == "grpo" else points_corrected(cell.get("delta_vs_grpo"))]
        lines.append(f"| {shown_name(results, name)} | " + " | ".join(cells) + " |")
    return lines + [""]


def _interpolated_from_start(results: dict[str, Any], levels: list[int]) -> str:
    """A warning for the counts at which GRPO had not been evaluated yet on some seed: its value there is a
    straight line from its start (step 0) to its first evaluation, not a measurement."""
    firsts = grpo_first_evaluations(results)
    early = [u for u in levels if any(f > u for f in firsts)]
    if not early:
        return ""
    return (f" At {', '.join(map(str, early))} update(s) GRPO had not been evaluated yet on some seed (its first "
            f"evaluation came at step {min(f for f in firsts if f)}-{max(firsts)}): its value there is a straight line "
            "from its start, so a Δ there compares against a guess, not a measurement.")


def controls_lines(results: dict[str, Any]) -> list[str]:
    pairs = results.get("controls") or []
    if not pairs:
        return []
    lines = ["## Credit methods against their shuffled controls", "",
             "The control trains on the method's own credit permuted among the segments of each trace "
             "(a `level=token` control: among its tokens): same magnitudes, no structure. "
             "Δ = method − control, final accuracy, points, paired by seed [95% interval]; corrected for the "
             "family of every method against its control (Holm-adjusted p; simultaneous 95% interval).",
             "",
             f"| method | control | Δ vs control | corrected | seeds to resolve Δ ({100 * POWER:.0f}% power) |",
             "|---|---|---|---|---|"]
    for p in pairs:
        delta = points(p["delta"]) if p["delta"] is not None else "method not in this comparison"
        lines.append(f"| {p['method']} | {p['control']} | {delta} | {corrected(p['delta'])} | "
                     f"{_seeds_needed(p['delta'])} |")
    return lines + [""]


def strongest_baseline_lines(results: dict[str, Any]) -> list[str]:
    """The table of every credit method against the strongest baseline, where that is not GRPO."""
    table = results.get("vs_strongest_baseline")
    if not table:
        return []
    base = shown_name(results, table["baseline"])
    lines = [f"## Credit methods against the strongest baseline, {base}", "",
             f"{base} ends above GRPO, so a credit method must beat it (the goals below judge against it). "
             f"Δ = method − {base}, final accuracy, points, paired by seed [95% interval]; corrected for the family "
             f"of every credit method against {base} (Holm-adjusted p; simultaneous 95% interval).", "",
             f"| method | Δ vs {base} | corrected | seeds to resolve Δ ({100 * POWER:.0f}% power) |",
             "|---|---|---|---|"]
    for row in table["rows"]:
        lines.append(f"| {shown_name(results, row['method'])} | {points(row['delta'])} | {corrected(row['delta'])} | "
                     f"{_seeds_needed(row['delta'])} |")
    return lines + [""]


def report(results: dict[str, Any]) -> str:
    estimate = results.get("estimate", {}).get("seconds")
    lines = [f"# credo compare ({results['preset']})", "",
             f"Start `{results['start']}` · budget {results['token_budget']:,} generated tokens per run · "
             f"commit `{short(results['commit'])}` · {results['date']} · {results['machine']}"
             + (f" · {results['wall_seconds'] / 60:.0f} min wall in its last invocation"
                if results.get("wall_seconds") else "")
             + (f" (estimated {describe(estimate)} before it started)" if estimate else "") + run_clocks(results), "",
             *([f"Command: `{results['command']}`", ""] if results.get("command") else []),
             *([f"Note: {results['note']}", ""] if results.get("note") else []),
             *commit_lines(results), *machine_lines(results), *protocol_lines(results), "",
             f"## At equal generated tokens ({results['token_budget']:,} per run)", "", *main_table(results), "",
             *strongest_baseline_lines(results), *equal_updates_lines(results), *controls_lines(results),
             *unequal_lines(results, lambda m: shown_name(results, m)),
             *premise_lines(results, lambda m: shown_name(results, m)), "## Reading", "", reading(results)]
    return "\n".join(lines) + "\n"


def run_clocks(results: dict[str, Any]) -> str:
    """The runs' own clocks, summed: a comparison resumed across invocations has no single wall time (the
    last invocation's is all `wall_seconds` sees), but each run's clock survives its resumptions."""
    seconds = [seed["seconds"] for entry in results["methods"].values() for seed in entry["seeds"].values()
               if seed.get("seconds") is not None]
    if not seconds:
        return ""
    jobs = (results.get("protocol") or {}).get("jobs", 1)
    stalls = [(seed.get("stalled_steps", 0), seed.get("stalled_seconds", 0.0))
              for entry in results["methods"].values() for seed in entry["seeds"].values()]
    stalled_steps, stalled = sum(n for n, _ in stalls), sum(s for _, s in stalls)
    return (f" · the runs' own clocks sum to {describe(sum(seconds))}"
            + (f", {jobs} at a time" if jobs > 1 else "")
            + (f" (leaving out {describe(stalled)} of {stalled_steps} stalled step(s), each over {STALL_FACTOR}x its "
               "run's median: a stopped process or a sleeping machine; counted at the median, here and in step "
               "times)" if stalled_steps else ""))


def reading(results: dict[str, Any]) -> str:
    entries = {k: v for k, v in results["methods"].items() if v.get("final_mean") is not None}
    if "grpo" not in entries:
        return "GRPO failed, so nothing can be read against it."
    g = entries["grpo"]
    best = max(entries.items(), key=lambda kv: kv[1]["final_mean"])
    seeds = max(len(v["seeds"]) for v in entries.values())
    parts = [f"GRPO ends at {g['final_mean']:.3f}. The best final accuracy is {best[0]}'s {best[1]['final_mean']:.3f} "
             f"({100 * (best[1]['final_mean'] - g['final_mean']):+.1f} points)."]
    if not unprivileged(best[1]):
        fair = [kv for kv in entries.items() if unprivileged(kv[1])]
        top = max(fair, key=lambda kv: kv[1]["final_mean"]) if fair else None
        parts.append((f"{best[0]} is privileged (†: it reads the task's reference solution or labels); "
                      if best[1].get("privileged") else
                      f"this version of credo no longer knows {best[0]} (†?: whether it reads privileged data cannot "
                      "be told); ")
                     + (f"the best method {'that does not' if best[1].get('privileged') else 'known to read none'} is "
                        f"{top[0]} at {top[1]['final_mean']:.3f}." if top
                        else "no method in the grid does without them."))
    faster = [k for k, v in entries.items() if k != "grpo" and v.get("tokens_to_grpo_end_ratio") is not None
              and v["seeds_reaching_grpo_end"] == len(v["seeds"]) and v["tokens_to_grpo_end_ratio"] < 0.995]
    if faster:
        floor = results.get("tokens_ratio_floor")
        parts.append("Reached GRPO's end accuracy (its mean at its last curve evaluation, on the curve's problems) on "
                     "every seed, with fewer generated tokens than GRPO's own curves on average (a seed's count is "
                     "its first evaluation at or above it, so it moves in steps of the eval interval"
                     + (f", and no ratio below {floor:.2f}x can be seen" if floor else "")
                     + "): "
                     + ", ".join(f"{k} ({entries[k]['tokens_to_grpo_end_ratio']:.2f}x)" for k in faster) + ".")
    parts += unequal_reading(results, entries)
    n_eval = results.get("final_eval_n", 500)
    se = (0.25 / n_eval) ** 0.5
    parts.append(f"One final evaluation on {n_eval} problems has a standard error of up to {se:.3f}; "
                 + (f"with {seeds} seed(s) there is no interval, and differences under "
                    f"~{2 * se * 2 ** 0.5:.2f} are not "
                    "evidence; run at least 2 seeds (the `full` preset has 3) before drawing conclusions." if seeds < 2
                    else "a difference is read as real only where it survives the correction for its family "
                    "of comparisons (every method against GRPO; every method against its control): its Holm-adjusted "
                    "p below 0.05. A raw 95% interval that excludes 0 is not enough when the row was picked among "
                    "many, and the simultaneous interval is the one to quote for a picked row; "
                    "'seeds to resolve Δ' is how many seeds a rerun would need to resolve it "
                    f"{100 * POWER:.0f}% of the "
                    "time if the mean and spread are as observed. Step times share the machine with whatever else ran "
                    "(the per-seed range shows how much that moved them)."))
    text = " ".join(parts)
    checks = goals(results)
    if checks:
        text += "\n\n## Goals (the seed papers' claims at our scale)\n\n| goal | holds | evidence |\n|---|---|---|\n"
        verdict = {True: "yes", False: "no", None: "not judged"}
        text += "\n".join(f"| {c['goal']} | {verdict[c['holds']]} | {c['evidence']} |" for c in checks)
    return text
