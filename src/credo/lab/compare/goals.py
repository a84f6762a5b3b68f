"""The seed papers' claims, judged on a comparison's results (docs/methods.md, "How a comparison judges").

Each goal is {goal, holds, evidence}. A goal needs every one of its comparisons (method pairs), and a comparison
is judged when its two methods share >= 2 finished seeds (an interval). holds is False as soon as one judged
comparison fails, True when all are judged and hold, else None ("not judged", the missing ones named in the
evidence). A difference counts only once the family of comparisons it belongs to is paid for: its Holm-adjusted p
(stats.correct_family; the families: every method vs GRPO, every method vs its control, a goal's own comparisons)
below 0.05 with its mean in the claimed direction. Decided before
the decisive comparison finished (the rule for partly judged goals, and goal (2)'s need of its token-level control,
before round two's grids had results), and applied to every comparison alike:

1. The best credit method is the one with the largest mean paired difference to the strongest baseline (the
   baseline row with the highest mean final: GRPO, or e.g. DAPO where it ends higher; decided 2026-12-06,
   before any grid on DAPO's recipe ran), chosen after the fact among k candidates; its interval is therefore
   widened to the 1 - 0.05/k level (Bonferroni), and goal (1) needs that interval above 0, a mean of >= +5
   points, and the baseline's end accuracy reached on every seed with, on average, <= 0.5x the tokens
   the baseline's own curves took to reach it (both counted the same way: the first evaluation at or above it;
   the first evaluation puts a floor under the ratio, which the evidence states against GRPO).
3. "Sooner" compares generated tokens to GRPO's end accuracy; a run that never reaches it counts as its own
   tokens plus one evaluation interval (it could have reached it at the next evaluation, no sooner).
4. "Every credit method" can only mean those with a `shuffled` control in the grid; the others are listed.
5. The accuracy a run must reach in (1) and (3) is the baseline's "end accuracy": its mean over seeds at the last
   curve evaluation, on the curve's problems, which are the problems every crossing is counted on (decided
   2026-12-07, before the SmolLM2 grid finished; until then its mean final accuracy on the larger final set,
   which can be easier or harder than the curve's by more than a method's gain).

A method marked privileged (†: it reads the task's reference solution or step labels) never alone answers a claim
about methods that do not: when goal (1)'s best method is privileged, a second row judges the best among the
methods that are not; goals (2) and (3) are answered by the grid's unprivileged SC-GRPO and SRPO rows (e.g.
`srpo:localiser=prompt`, the paper's self-localisation) and read 'not judged' when only privileged ones ran.
Goal (2) also needs SC-GRPO above its token-level control (`shuffled:of=sc_grpo:level=token`): without it in the grid
that half is not judged. Goal (3) compares with the grid's RRPO row (`rrpo`, or `srpo:localiser=random`): without
one that half is not judged (the GRPO half still is).
"""

from __future__ import annotations

import math
from typing import Any

from credo.credit.registry import parse_spec
from credo.lab.compare.stats import (LEVEL, control_pairs, control_target, correct_family, excludes_zero,
                                     mean_end_accuracy, paired, paired_deltas, resolution, resolved, tokens_to_reach)
from credo.lab.audit.premises import premises_of

BASELINES = ("grpo", "dr_grpo", "rloo", "dapo", "gspo")
BEST = ("the best credit method ends >= +5 points above the strongest baseline (GRPO, or the baseline that ends "
        "higher; selection-adjusted interval above 0) and reaches that baseline's end accuracy on every seed with "
        "<= 0.5x the tokens the baseline took to reach it")
BEST_UNPRIVILEGED = "the same among the credit methods that read no privileged data (no †)"
SC = "SC-GRPO ends above GRPO and above its token-level control (Holm-adjusted p < 0.05 in each family, above 0)"
SRPO = ("SRPO with self-localisation reaches GRPO's end accuracy sooner than RRPO and sooner than GRPO "
        "(Holm-adjusted p < 0.05 over the two, below 0)")
CONTROLS = ("every credit method with a shuffled control in the grid ends above it (Holm-adjusted p < 0.05 over the "
            "controls, above 0)")


def points(interval: dict[str, Any] | None) -> str:
    """'+3.3 [+1.9, +4.8]' (accuracy differences in points, with the interval when there is one)."""
    if not interval or interval.get("mean") is None:
        return "—"
    text = f"{100 * interval['mean']:+.1f}"
    return text + (f" [{100 * interval['ci'][0]:+.1f}, {100 * interval['ci'][1]:+.1f}]" if interval.get("ci") else "")


def corrected(interval: dict[str, Any] | None) -> str:
    """'Holm p 0.089; [-0.9, +8.2]': a comparison's p adjusted for its family (stats.correct_family) and its
    simultaneous interval, in points; '—' outside any family (fewer than 2 seeds)."""
    if not interval or interval.get("p_holm") is None:
        return "—"
    return f"Holm p {_p(interval['p_holm'])}; {_simultaneous(interval)}"


def _simultaneous(interval: dict[str, Any]) -> str:
    low, high = interval["ci_simultaneous"]
    return f"[{100 * low:+.1f}, {100 * high:+.1f}]"


def _p(value: float) -> str:
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def points_corrected(interval: dict[str, Any] | None, unit: str = "") -> str:
    """points() and `unit` with the family's correction beside it: '+1.9 [+0.1, +3.6] points (Holm p 0.262 among
    12; simultaneous [-1.2, +4.9])'."""
    text = points(interval) + unit
    if not interval or interval.get("p_holm") is None:
        return text
    return (text + f" (Holm p {_p(interval['p_holm'])} among {interval['family_size']}; simultaneous "
            f"{_simultaneous(interval)})")


def credit_methods(names: Any) -> list[str]:
    """The compared methods that assign credit: neither a baseline (with any options: grpo:std=population is
    GRPO; but a baseline recipe on another estimator's credit, dapo:of=rredcot, is that credit) nor a shuffled
    control."""
    return [k for k in names if (parse_spec(k)[0] not in BASELINES or "of" in parse_spec(k)[1])
            and control_target(k) is None]


def unprivileged(entry: dict[str, Any]) -> bool:
    """Whether a method's row is known to read no privileged data: a method this version no longer knows
    (privileged None) answers no claim about unprivileged methods."""
    return entry.get("privileged") is False


def privilege_mark(privileged: bool | None) -> str:
    """A row's mark: '†' reads privileged data, '†?' this version of credo cannot tell (None), '' neither."""
    return "†" if privileged else "†?" if privileged is None else ""


def _final(run: dict[str, Any]) -> Any:
    return run.get("final_accuracy")


def _short(pairs: list[tuple[str, str, int]]) -> str:
    """'a and b share 1 finished seed(s); ...' for the pairs with no interval (fewer than 2 shared seeds)."""
    return "; ".join(f"{a} and {b} share {n} finished seed(s)" for a, b, n in pairs if n < 2)


def _every(verdicts: list[bool | None]) -> bool | None:
    """A goal that needs every one of its comparisons: False as soon as one judged comparison fails (more seeds
    of the others cannot rescue it), True when all are judged and hold, else None (not judged)."""
    if any(v is False for v in verdicts):
        return False
    return None if any(v is None for v in verdicts) else True


def _shared(results: dict[str, Any], a: str, b: str) -> tuple[str, str, int]:
    seeds = [set(results["methods"].get(m, {}).get("seeds", {})) for m in (a, b)]
    return a, b, len(seeds[0] & seeds[1])


def _variants(results: dict[str, Any], base: str) -> tuple[str | None, list[str]]:
    """(the grid's row answering a claim about `base`, its privileged rows): among the methods named `base` or
    `base:<options>` that read no privileged data, `base` itself if it is one, else the first in grid order
    (None if none ran); and those that do (†). For srpo only rows that localise by asking the policy (`prompt`,
    `self`) count: srpo:localiser=random is RRPO."""
    rows = [m for m in results["methods"] if parse_spec(m)[0] == base]
    if base == "srpo":
        rows = [m for m in rows if premises_of(m)[1] is not None]
    fair = [m for m in rows if unprivileged(results["methods"][m])]
    return (base if base in fair else (fair[0] if fair else None)), [m for m in rows if m not in fair]


def _marked(results: dict[str, Any], rows: list[str]) -> str:
    """Rows named with their mark (privilege_mark)."""
    return ", ".join(f"{m} {privilege_mark(results['methods'][m].get('privileged'))}" for m in rows)


def _privileged_only(goal: str, base: str, rows: list[str], results: dict[str, Any]) -> dict[str, Any]:
    if not rows:  # e.g. only srpo:localiser=random, which is RRPO
        return {"goal": goal, "holds": None,
                "evidence": f"not judged: no {base} row in the grid localises by asking the policy (prompt or self)"}
    marked = _marked(results, rows)
    return {"goal": goal, "holds": None,
            "evidence": f"not judged: the grid's {base} rows ({marked}) read the task's reference solution or labels"
                        f"{' (†), or may (†?)' if '†?' in marked else ''}, and the claim is about one that does not"}


def strongest_baseline(results: dict[str, Any]) -> str:
    """The baseline row (GRPO, Dr. GRPO, RLOO, DAPO or GSPO, without another estimator's credit) with the highest
    mean final accuracy; GRPO on a tie or where no other baseline finished. Picking the strongest is what the
    claim must beat, so it needs no correction for the choice."""
    rows = [m for m, e in results["methods"].items() if parse_spec(m)[0] in BASELINES and "of" not in parse_spec(m)[1]
            and e.get("final_mean") is not None]
    best = max(rows, key=lambda m: (results["methods"][m]["final_mean"], m == "grpo"), default="grpo")
    return best if results["methods"].get(best, {}).get("final_mean") is not None else "grpo"


def vs_strongest_baseline(results: dict[str, Any]) -> dict[str, Any] | None:
    """Every credit method against the strongest baseline where that is not GRPO (the main table has GRPO):
    {baseline, rows: [{method, delta}]}, the rows corrected as one family (stats.correct_family); None where
    GRPO is the strongest."""
    base = strongest_baseline(results)
    if base == "grpo":
        return None
    rows = [{"method": m, "delta": _vs(results, m, base)} for m in credit_methods(results["methods"])]
    correct_family([row["delta"] for row in rows], f"every credit method vs {base}, final accuracy")
    return {"baseline": base, "rows": rows}


def _vs(results: dict[str, Any], name: str, base: str) -> dict[str, Any]:
    """`name`'s paired difference of final accuracy to `base` (delta_vs_grpo where base is GRPO)."""
    if base == "grpo":
        return results["methods"][name].get("delta_vs_grpo") or {}
    return paired(paired_deltas(results["methods"][name]["seeds"], results["methods"][base]["seeds"], _final),
                  resolution=resolution(results))


def _best_of(results: dict[str, Any], privileged: bool = True,
             base: str = "grpo") -> tuple[str | None, list[str], list[str]]:
    """(the credit method with the largest mean Δ vs `base` or None, the candidates, those left out for want of
    2 seeds paired with it); `privileged` False: among the methods without † only."""
    entries = results["methods"]
    credit = [m for m in credit_methods(entries) if privileged or unprivileged(entries[m])]
    # a method paired with the baseline on fewer than 2 seeds has no interval: it cannot be judged the best
    deltas = {m: _vs(results, m, base) for m in credit if base in entries}
    candidates = [m for m in credit if deltas.get(m, {}).get("n", 0) >= 2]
    name = max(candidates, key=lambda m: deltas[m]["mean"]) if candidates else None
    return name, candidates, [m for m in credit if m not in candidates]


def _reach(results: dict[str, Any], name: str, base: str) -> tuple[int, float | None]:
    """(seeds of `name` reaching `base`'s end accuracy, their mean tokens to it ÷ base's own, counted alike)."""
    entries = results["methods"]
    if base == "grpo":
        return entries[name]["seeds_reaching_grpo_end"], entries[name].get("tokens_to_grpo_end_ratio")
    target = mean_end_accuracy(entries[base]["seeds"])
    own = [t for r in entries[base]["seeds"].values() if (t := tokens_to_reach(r["curve"], target))]
    reached = [t for r in entries[name]["seeds"].values() if (t := tokens_to_reach(r["curve"], target))]
    ratio = sum(reached) / len(reached) / (sum(own) / len(own)) if reached and own else None
    return len(reached), ratio


def _best_credit(results: dict[str, Any], goal: str = BEST, privileged: bool = True) -> dict[str, Any]:
    """Goal (1) among the credit methods (`privileged` False: only those without †)."""
    base = strongest_baseline(results)
    name, candidates, left_out = _best_of(results, privileged, base)
    if name is None:
        return {"goal": goal, "holds": None,
                "evidence": "not judged: no credit method" + ("" if privileged else " without †")
                            + f" shares 2 finished seeds with {base}"}
    entry, k = results["methods"][name], len(candidates)
    adjusted = paired(paired_deltas(entry["seeds"], results["methods"][base]["seeds"], _final),
                      level=1 - (1 - LEVEL) / k, resolution=resolution(results))
    n = len(entry["seeds"])
    reached, ratio = _reach(results, name, base)
    shown = "GRPO" if base == "grpo" else base
    # in points rounded to 1e-6: a mean of exactly +5 points must not fail on its float sum (0.04999999999999999)
    holds = (round(100 * adjusted["mean"], 6) >= 5 and bool(excludes_zero(adjusted, +1)) and reached == n
             and ratio is not None and ratio <= 0.5)
    floor = results.get("tokens_ratio_floor") if base == "grpo" else None  # measured against GRPO's tokens
    delta = _vs(results, name, base)
    return {"goal": goal, "holds": holds,
            "evidence": ("" if base == "grpo" else
                         f"the strongest baseline is {base} ({results['methods'][base]['final_mean']:.3f}, GRPO "
                         f"{results['methods']['grpo']['final_mean']:.3f}); ")
                        + (f"best of {k} credit methods by Δ vs {shown}: {name}, {points(delta)} points "
                         f"(95%), [{100 * adjusted['ci'][0]:+.1f}, {100 * adjusted['ci'][1]:+.1f}] at "
                         f"{100 * (1 - (1 - LEVEL) / k):.1f}% for the choice among {k}" if k > 1 else
                         f"the only credit method, {name}: {points(delta)} points (95%)"
                         + ("" if base == "grpo" else f" vs {shown}"))
                        + f"; reaches {shown}'s end accuracy on {reached}/{n} seeds, with " + _ratio(ratio)
                        + f" the tokens {shown}'s curves took to reach it, on average"
                        + (f" (the first evaluation puts a floor of {floor:.2f}x under this ratio)" if floor else "")
                        + (f" (left out, fewer than 2 seeds: {', '.join(left_out)})" if left_out else "")
                        + (f"; {name} is privileged (†: it reads the task's reference solution or labels), so this "
                           "answers the claim only for a method that does; the next row answers it for the others"
                           if entry.get("privileged") else "")
                        + (f"; this version of credo no longer knows {name} (†?: whether it reads privileged data "
                           "cannot be told); the next row answers the claim for the methods known not to"
                           if entry.get("privileged", False) is None else "")}


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "—"


def _sc_above(results: dict[str, Any]) -> dict[str, Any]:
    """Goal (2): the unprivileged SC-GRPO row above GRPO and above its token-level control (the structure-free
    control for token weights); without that control in the grid the second half is not judged."""
    name, privileged = _variants(results, "sc_grpo")
    if name is None:
        return _privileged_only(SC, "sc_grpo", privileged, results)
    controls = [p for p in (results.get("controls") or control_pairs(results))
                if p["method"] == name and parse_spec(p["control"])[1].get("level") == "token"]
    delta = results["methods"][name]["delta_vs_grpo"]
    verdicts = [resolved(delta, +1)] + [resolved(p["delta"], +1) for p in controls] + ([] if controls else [None])
    judged = ([f"{name} {points_corrected(delta, ' points')} vs GRPO (paired over {delta['n']} seeds)"]
              if delta["n"] >= 2 else [])
    judged += [f"{name} − {p['control']}: {points_corrected(p['delta'], ' points')}" for p in controls
               if (p["delta"] or {}).get("n", 0) >= 2]
    missing = [_short([_shared(results, name, "grpo")] + [_shared(results, name, p["control"]) for p in controls]),
               "" if controls else f"no token-level control in the grid (shuffled:of={name}:level=token)"]
    return _judgement(SC, _every(verdicts), judged, missing)


def _judgement(goal: str, holds: bool | None, judged: list[str], missing: list[str]) -> dict[str, Any]:
    """A goal's row from its judged comparisons (their figures) and what is missing (empty parts skipped): a
    judged failure decides it even while another comparison lacks seeds (_every)."""
    evidence, missing = "; ".join(judged), "; ".join(filter(None, missing))
    if missing:
        evidence = (f"{evidence}; " if evidence else "") + "not judged: " + missing
    return {"goal": goal, "holds": holds, "evidence": evidence}


def _eval_every(results: dict[str, Any]) -> int:
    """Generated tokens between two curve evaluations (a quarter of the budget in results without a protocol)."""
    return (results.get("protocol") or {}).get("eval_every_tokens") or results["token_budget"] // 4


def _tokens_to_target(results: dict[str, Any]) -> Any:
    every = _eval_every(results)

    def tokens(run: dict[str, Any]) -> int:  # never reached: no sooner than the evaluation after its last
        reached = run.get("tokens_to_grpo_end")
        return reached if reached else run.get("tokens_generated", results["token_budget"]) + every
    return tokens


def _rrpo_row(results: dict[str, Any]) -> str | None:
    """The grid's RRPO row: `rrpo`, or an srpo row that resets at random steps (the same recipe); None if none."""
    if "rrpo" in results["methods"]:
        return "rrpo"
    return next((m for m in results["methods"] if parse_spec(m)[0] == "srpo"
                 and parse_spec(m)[1].get("localiser") == "random"), None)


def _srpo_sooner(results: dict[str, Any]) -> dict[str, Any]:
    """SRPO reaches GRPO's end accuracy sooner than RRPO and than GRPO: per-seed differences in generated tokens
    to it, each interval below 0. Those counts are rounded up to the next evaluation, so
    their paired sd is floored at what that rounding alone gives a difference of two (one interval / sqrt(6)):
    seeds that agree to the evaluation must not make a zero-width interval. Without an RRPO row that half is
    not judged; the GRPO half still is."""
    srpo, privileged = _variants(results, "srpo")
    if srpo is None:
        return _privileged_only(SRPO, "srpo", privileged, results)
    rrpo = _rrpo_row(results)
    tokens, m, rounding = _tokens_to_target(results), results["methods"], _eval_every(results) / math.sqrt(6)
    vs = {other: paired(paired_deltas(m[srpo]["seeds"], m[other]["seeds"], tokens), resolution=rounding)
          for other in (rrpo, "grpo") if other is not None}
    correct_family(list(vs.values()), "this goal's comparisons")

    def k(iv: dict[str, Any]) -> str:
        return f"{iv['mean'] / 1e3:+,.0f}k" + (f" [{iv['ci'][0] / 1e3:+,.0f}k, {iv['ci'][1] / 1e3:+,.0f}k]"
                                               if iv["ci"] else "") + (
            f" (Holm p {_p(iv['p_holm'])} among {iv['family_size']})" if iv.get("p_holm") is not None else "")

    judged = [f"{srpo} − {other} {k(iv)}" for other, iv in vs.items() if iv["n"] >= 2]
    if judged:
        judged[0] = ("generated tokens to GRPO's end accuracy (never reached: the run's tokens + one evaluation "
                     "interval), paired by seed: " + judged[0])
        judged.append("seeds reaching: " + ", ".join(f"{r} {m[r]['seeds_reaching_grpo_end']}/{len(m[r]['seeds'])}"
                                                     for r in (srpo, rrpo) if r is not None)
                      + (f" (not judged here, as they read or may read the reference: {_marked(results, privileged)})"
                         if privileged else ""))
    missing = [_short([_shared(results, srpo, other) for other in vs]),
               "no RRPO row in the grid (rrpo, or srpo:localiser=random)" if rrpo is None else ""]
    verdicts = [resolved(iv, -1) for iv in vs.values()] + ([None] if rrpo is None else [])
    return _judgement(SRPO, _every(verdicts), judged, missing)


def _controls(results: dict[str, Any], pairs: list[dict[str, Any]]) -> dict[str, Any]:
    credit = credit_methods(results["methods"])
    orphans = [p["control"] for p in pairs if p["method"] not in results["methods"]]  # nothing to be above
    pairs = [p for p in pairs if p["method"] in credit]
    uncontrolled = [m for m in credit if m not in {p["method"] for p in pairs}]
    note = ("".join([f" (no control in the grid: {', '.join(uncontrolled)})" if uncontrolled else "",
                     f" (controls without their method, left out: {', '.join(orphans)})" if orphans else ""]))
    if not pairs:
        return {"goal": CONTROLS, "holds": None, "evidence": "not judged: no credit method has its control" + note}
    judged = [f"{p['method']} − {p['control']}: {points_corrected(p['delta'], ' points')}" for p in pairs
              if p["delta"]["n"] >= 2]
    row = _judgement(CONTROLS, _every([resolved(p["delta"], +1) for p in pairs]), judged,
                     [_short([_shared(results, p["method"], p["control"]) for p in pairs])])
    return {**row, "evidence": row["evidence"] + note}


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals whose methods the comparison planned (a planned method that failed on every seed leaves
    its goal 'not judged', never absent). Needs summarise() to have run."""
    planned = set(results["methods"])
    if "grpo" not in planned:
        return []
    out = []
    if credit_methods(planned):
        out.append(_best_credit(results))
        best = _best_of(results, base=strongest_baseline(results))[0]
        if best is not None and not unprivileged(results["methods"][best]):
            out.append(_best_credit(results, BEST_UNPRIVILEGED, privileged=False))
    bases = {parse_spec(m)[0] for m in planned}
    if "sc_grpo" in bases:
        out.append(_sc_above(results))
    if "srpo" in bases:  # _srpo_sooner: only srpo rows that ask the policy answer it, against an RRPO row
        out.append(_srpo_sooner(results))
    pairs = results.get("controls") or control_pairs(results)
    if pairs:
        out.append(_controls(results, pairs))
    return out


