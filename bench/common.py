"""Shared helpers for bench scripts: timing, results as JSON + a markdown table."""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Callable

import torch


def timed(fn: Callable[[], object], repeats: int = 3) -> float:
    """Best wall time of `repeats` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def write(name: str, rows: list[dict], notes: str = "") -> None:
    """Print a markdown table and write bench/results/<name>.json and .md."""
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d")}
    keys = list(rows[0]) if rows else []
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    table = "\n".join(lines)
    print(table)
    if notes:
        print(notes)
    base = os.path.join(os.path.dirname(__file__), "results", name)
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows, "notes": notes}, f, indent=2)
    with open(base + ".md", "w") as f:
        f.write(f"# {name}\n\n{meta}\n\n{table}\n\n{notes}\n")
