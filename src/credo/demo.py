"""`make demo`: the main job on the built-in default, `credo compare --preset quick`.

Writes runs/demo-<time>/ (results.json, report.md, curves.png, audit.png) and prints the report.
"""

from __future__ import annotations

import sys
import time

from credo.cli import main

if __name__ == "__main__":
    out = f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"credo demo: credo compare --preset quick --out {out}", flush=True)
    sys.exit(main(["compare", "--preset", "quick", "--out", out]))
