"""What acts unequally on the methods of a comparison, shown in its report: gradient-norm clipping (a method whose
credit sits on few tokens has larger gradients, so the same clip rescales more of its steps) and DAPO's
overlong penalty (a method that shapes its rewards by length)."""

from __future__ import annotations

from typing import Any, Callable


def unequal_lines(results: dict[str, Any], shown: Callable[[str], str]) -> list[str]:
    """The report's section on clipping (a table) and on any overlong penalty a method's runs applied; nothing
    when no run recorded either. shown: a method's name as the report's tables show it."""
    lines = clipping_lines(results, shown)
    overlong = overlong_sentences(results, shown)
    if not overlong:
        return lines
    if not lines:
        return ["## What acts unequally on methods: DAPO's overlong penalty", "", " ".join(overlong), ""]
    return lines + ["**DAPO's overlong penalty.** " + " ".join(overlong), ""]


def overlong_sentences(results: dict[str, Any], shown: Callable[[str], str]) -> list[str]:
    """One sentence per distinct overlong penalty the methods' runs applied (runs.run_overlong): where it starts,
    and whether it was fitted to the task's worked solutions, naming every method that applied it."""
    applied: dict[tuple[str, str, str], list[str]] = {}  # (verb, its plural, the rest of the sentence) -> methods
    for name, entry in results["methods"].items():
        runs = [r["overlong"] for r in entry.get("seeds", {}).values() if r.get("overlong")]
        if runs:
            applied.setdefault(_overlong_penalty(runs), []).append(shown(name))
    out = []
    for (verb, plural, rest), names in applied.items():
        subject = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        out.append(f"{subject} {verb if len(names) == 1 else plural} {rest}")
    return out


def _overlong_penalty(runs: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(verb, its plural, the rest of the sentence) describing the overlong penalty of one method's runs."""
    first = runs[0]  # a method's seeds share its config; the buffer, fitted per run, is listed over them
    buffer = "/".join(str(b) for b in sorted({r["buffer"] for r in runs}))
    longest = first.get("longest_worked_solution")
    if buffer == "0":
        return "applies", "apply", (f"no overlong penalty: fitted to the task, the buffer is 0 (the longest worked "
                                    f"solution of {first['fit_problems']} training problems, {longest} tokens, fills "
                                    f"the {first['max_new_tokens']}-token limit).")
    if longest is not None:
        how = (f"fitted to the task so that no worked solution of {first['fit_problems']} training problems "
               f"reaches it (the longest is {longest} tokens)")
    else:
        how = "as set, not fitted to the task: a correct solution that long is penalised too"
    return "penalises", "penalise", (f"completions that reach into the last {buffer} of {first['max_new_tokens']} "
                                     f"new tokens (DAPO's overlong penalty), {how}.")


def clipping_lines(results: dict[str, Any], shown: Callable[[str], str]) -> list[str]:
    """The table of what gradient-norm clipping did to each method (it acts unequally: a method whose credit
    sits on few tokens has larger gradients); nothing when no run recorded gradient norms."""
    rows = [(name, entry["clipping"]) for name, entry in results["methods"].items() if entry.get("clipping")]
    if not rows:
        return []
    lines = ["## What acts unequally on methods: gradient-norm clipping", "",
             "Each step's pre-clip gradient norm is the mean over its updates (`grad_norm` in metrics.jsonl). "
             "Clipping rescales a step's gradient to the clip's norm and never changes its direction; under AdamW "
             "it mostly equalises the steps' weights in the moment estimates (a method clipped on every step runs "
             "normalised-gradient Adam). The concentration that makes a method's norm large is its own "
             "normalisation of credit, not the clip.", "",
             "| method | steps above the clip (mean over seeds) | median pre-clip gradient norm | clip | median "
             "update size after AdamW, ‖Δθ‖ per update (— : runs from before it was logged) |",
             "|---|---|---|---|---|"]
    for name, c in rows:
        clip = ", ".join(f"{v:g}" for v in c["grad_clip"])
        size = c.get("update_norm_median")
        lines.append(f"| {shown(name)} | {100 * c['clipped_share']:.0f}% | {c['grad_norm_median']:.2f} | "
                     f"{clip} | {'—' if size is None else f'{size:.3g}'} |")
    return lines + [""]


def unequal_reading(results: dict[str, Any], entries: dict[str, Any]) -> list[str]:
    """Reading lines for what acts unequally: methods clipped on more than half their steps, and methods
    that made far fewer updates than GRPO in the token budget (their final says little about their credit)."""
    parts = []
    clipped = [f"{k} ({100 * v['clipping']['clipped_share']:.0f}%)" for k, v in entries.items()
               if k != "grpo" and v.get("clipping") and v["clipping"]["clipped_share"] > 0.5]
    if clipped:
        grpo = entries["grpo"].get("clipping")
        parts.append("Gradient-norm clipping acted on more than half the steps of " + ", ".join(clipped)
                     + (f" (GRPO: {100 * grpo['clipped_share']:.0f}%)" if grpo else "")
                     + ": each of those steps was rescaled to the clip's norm (its direction kept), so under Adam "
                     "their steps weigh alike in the moment estimates; the large norms come from the methods' own "
                     "normalisations (see the clipping table).")
    grpo_steps = [r["steps"] for r in entries["grpo"]["seeds"].values() if "steps" in r]
    if grpo_steps:
        few = [f"{k} ({min(r['steps'] for r in v['seeds'].values())} against GRPO's {min(grpo_steps)})"
               for k, v in entries.items() if k != "grpo" and all("steps" in r for r in v["seeds"].values())
               and v["seeds"] and max(r["steps"] for r in v["seeds"].values()) < 0.5 * min(grpo_steps)]
        if few:
            parts.append("Made under half GRPO's updates in the same generated tokens, so their final accuracy "
                         "measures their cost more than their credit (compare them at equal updates above): "
                         + ", ".join(few) + ".")
    return parts
