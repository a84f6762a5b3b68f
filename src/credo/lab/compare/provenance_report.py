"""The report's notes on what trained its runs: more than one version of credo (each run's summary.json records
its commit: credo.train.provenance), or more than one setup (its hardware: credo.policy.device.hardware)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from credo.train.provenance import package_changes, short


def commit_lines(results: dict[str, Any]) -> list[str]:
    """A warning when the runs were trained by more than one version of credo (a comparison resumed across
    sessions reuses finished runs whatever is checked out; each run's summary.json records its commit).
    Runs from before that record are counted as 'not recorded' only beside runs that have one."""
    counts = _counts(results, "commit")
    if len(counts) < 2:
        return []
    def name(commit: str) -> str:
        return commit if commit == "not recorded" else f"`{short(commit)}`"
    listed = ", ".join(f"{name(c)} ({n} run{'s' if n > 1 else ''})"
                       for c, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return [f"**Runs trained by {len(counts)} versions of credo**: {listed}. {_between(list(counts))}", ""]


def _between(versions: list[str]) -> str:
    """What differs between the versions, as far as this checkout's history says (package_changes)."""
    recorded = [v for v in versions if v != "not recorded"]
    changed = package_changes(recorded)
    if changed is None or (len(recorded) < len(versions) and len({v[:40] for v in recorded}) < 2):
        # (one commit beside runs that recorded none: those came from older code, which git cannot name)
        return ("A change between them that touched training makes this table compare different programs; check "
                "`git diff` between them.")
    unknown = (["the uncommitted edits of '+dirty' ones"] if any(v.endswith("+dirty") for v in recorded) else []) + (
        ["what trained the runs that recorded no version"] if len(recorded) < len(versions) else [])
    caveat = f" (not counting {' nor '.join(unknown)})" if unknown else ""
    if not changed:
        return f"No file of the package differs between their commits{caveat}."
    folders: dict[str, list[str]] = {}
    for path in changed:
        folder, _, name = path.rpartition("/")
        folders.setdefault(folder + "/" if folder else "", []).append(name.removesuffix(".py"))
    listed = "; ".join(f"`{folder or './'}` {', '.join(names)}" for folder, names in folders.items())
    return (f"The package's files that differ between their commits{caveat}: {listed}. A change there that "
            "touched training makes this table compare different programs.")


def machine_lines(results: dict[str, Any]) -> list[str]:
    """A note when the runs were computed on more than one setup (each run's summary.json records
    credo.policy.device.hardware: the CPU's model and vector unit or the GPU, the threads, torch): each run's
    numbers are its setup's, so accuracies differ as other seeds would, but seconds a step measured on different
    machines do not compare. Runs from before that record are left out."""
    counts = _counts(results, "machine")
    counts.pop("not recorded", None)
    if len(counts) < 2:
        return []
    listed = "; ".join(f"{m} ({n} run{'s' if n > 1 else ''})" for m, n in counts.most_common())
    return [f"**Runs computed on {len(counts)} setups**: {listed}. Float32 sums may round differently on "
            "each, and then a seed's run is its setup's (accuracies vary as between seeds); the clocks (seconds a "
            "step, step-time ratios) of runs on different machines do not compare.", ""]


def _counts(results: dict[str, Any], field: str) -> Counter:
    """How many runs record each value of `field` (a run without it: 'not recorded')."""
    return Counter(seed.get(field, "not recorded") for entry in results["methods"].values()
                   for seed in entry["seeds"].values())
