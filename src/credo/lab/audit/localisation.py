"""The reset localisers' figures as SRPO uses them (where a localiser resets, its top-1 by the first error's
position and kind) and their audit.md tables; credo.lab.audit.run scores the localisers, and
credo.lab.audit.premises measures the same figures without a reference."""

from __future__ import annotations

import math
from typing import Any, Sequence

from credo.lab.audit.report import table_figure
from credo.tasks.base import SLIPS


def pick_figures(picks: Sequence[int], first: Sequence[int],
                 slips: Sequence[str | None] = ()) -> dict[str, dict[str, float]]:
    """Where a localiser resets, as SRPO uses it: `share_by_step`, the share of its resets at each step
    ('1', '2', ...; 1-based; `pick_figures(first, first)` gives the oracle's); `top1_by_position`, its
    first-error top-1 split by where the first error lies ('step 1', 'steps 2-3', 'steps 4+'); with `slips`
    (the kind of each first error, credo.tasks.base.SLIPS, listed in that order), `top1_by_slip` and
    `slip_counts`. picks and first:
    0-based steps, one per wrong trace."""

    def shares(steps: Sequence[int]) -> dict[str, float]:
        counts: dict[int, int] = {}
        for k in steps:
            counts[k] = counts.get(k, 0) + 1
        return {str(k + 1): c / max(len(steps), 1) for k, c in sorted(counts.items())}

    def split(keys: Sequence[Any]) -> dict[str, list[int]]:
        buckets: dict[str, list[int]] = {}
        for key, k, e in zip(keys, picks, first):
            if key is not None:
                buckets.setdefault(key, []).append(int(k == e))
        return buckets

    out = {"share_by_step": shares(picks), "top1_by_position": {b: sum(h) / len(h) for b, h in sorted(split(
               ["step 1" if e == 0 else "steps 2-3" if e <= 2 else "steps 4+" for e in first]).items())}}
    by_slip = sorted(split(slips).items(), key=lambda item: SLIPS.index(item[0]))  # in the order reports list them
    if by_slip:
        out["top1_by_slip"] = {kind: sum(h) / len(h) for kind, h in by_slip}
        out["slip_counts"] = {kind: len(h) for kind, h in by_slip}
    return out


def localiser_table(loc: dict[str, Any]) -> str:
    lines = [f"## Reset localisers ({loc['traces']} incorrect traces with a labelled first error before their last "
             f"segment; each parent valued alone, as at training time; the oracle resets at step 1 in "
             f"{loc['oracle_step1_share']:.3f}, a uniform guess scores top-1 "
             f"{loc.get('random_top1_expectation', math.nan):.3f})", "",
             "| localiser | localisation_top1 | top1 loc | step-1 share | reset_success | after_error_success | "
             "clean_prefix_gain | tokens scored / trace | parse rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    privileged = set(loc.get("privileged_localisers", ()))
    for name, m in loc["localisers"].items():
        shown = f"{name} (ran {m['resolved']})" if "resolved" in m else name
        lines.append(f"| {shown}{' †' if name in privileged else ''} | {m['localisation_top1']:.3f} | "
                     f"{m['localisation_top1_localisable']:.3f} | "
                     f"{m['step1_share']:.3f} | {m['reset_success']:.3f} | {m['after_error_success']:.3f} | "
                     f"{m['clean_prefix_gain']:+.3f} | {m['tokens_scored_per_trace']:.0f} | "
                     f"{table_figure(m.get('parse_rate'))} |")
    for name, why in loc["failures"].items():
        lines.append(f"| {name} | failed: {why} |" + " |" * 8)
    if "oracle_share_by_step" in loc:  # audits from before the split have none
        steps = sorted({k for m in [loc["oracle_share_by_step"], *(m.get("share_by_step", {}) for m in
                                                                  loc["localisers"].values())] for k in m}, key=int)
        lines += ["", "Share of resets at each step (the oracle's: where the first errors lie), and top-1 by where "
                  "the first error lies:", "", "| localiser | " + " | ".join(f"step {k}" for k in steps)
                  + " | top-1 by first-error position |", "|---|" + "---|" * (len(steps) + 1)]
        for name, shares in [("oracle (first errors)", loc["oracle_share_by_step"]),
                             *((n, m.get("share_by_step", {})) for n, m in loc["localisers"].items())]:
            split = loc["localisers"].get(name, {}).get("top1_by_position", {})
            lines.append(f"| {name} | " + " | ".join(f"{shares.get(k, 0.0):.2f}" for k in steps) + " | "
                         + (", ".join(f"{b} {v:.2f}" for b, v in split.items()) or "—") + " |")
    lines += slip_table(loc["localisers"])
    return "\n".join(lines) + "\n"


def slip_table(localisers: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines of each localiser's top-1 by the kind of the first error (a wrong result needs the sum
    checked; a miscopied operand or carried value, only a copy), with how many traces each kind has; none when
    the task does not tell the kinds."""
    counts = next((m["slip_counts"] for m in localisers.values() if "slip_counts" in m), None)
    if not counts:
        return []
    kinds = list(counts)
    lines = ["", "Top-1 by the kind of the first error (traces of each kind in brackets):", "",
             "| localiser | " + " | ".join(f"{k} ({counts[k]})" for k in kinds) + " |", "|---|" + "---|" * len(kinds)]
    for name, m in localisers.items():
        if "top1_by_slip" in m:
            lines.append(f"| {name} | " + " | ".join(f"{m['top1_by_slip'].get(k, math.nan):.2f}" for k in kinds) + " |")
    return lines
