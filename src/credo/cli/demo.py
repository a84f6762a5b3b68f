"""`make demo`: the main job on the built-in default, `credo compare --preset quick`.

Writes runs/demo-<time>/ (results.json, report.md, curves.png, audit.png) and prints the report.
"""

from __future__ import annotations

import os
import sys
import time

from credo.cli.main import main

if __name__ == "__main__":
    out = f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    jobs = "2" if (os.cpu_count() or 1) >= 2 else "1"  # two one-thread runs side by side (bench/compare_jobs.py)
    argv = ["compare", "--preset", "quick", "--jobs", jobs, "--out", out]
    print(f"credo demo: credo {' '.join(argv)}", flush=True)
    sys.exit(main(argv))
