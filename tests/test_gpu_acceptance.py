"""examples/gpu/acceptance.sh --dry-run: every check of the GPU acceptance script passes on the CPU with tiny
settings and a tiny random Llama built from a config (in place of SmolLM2), writing only under its OUT_DIR."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from credo.lab.audit.report import plot_audit

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPT = os.path.join(ROOT, "examples", "gpu", "acceptance.sh")
CHECKS = ("sft", "audit", "compare", "trl", "verl")


def test_the_acceptance_dry_run_passes_every_check_and_writes_only_under_its_out_dir(tmp_path):
    out, cwd = tmp_path / "acceptance", tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "CREDO": os.path.join(os.path.dirname(sys.executable), "credo"),
           "PYTHONPATH": os.path.join(ROOT, "src"), "CREDO_CACHE": str(tmp_path / "unused-cache")}
    env.pop("OUT", None)
    done = subprocess.run(["bash", SCRIPT, "--dry-run", str(out)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)
    printed = done.stdout
    assert done.returncode == 0, printed + done.stderr[-2000:]
    for check in CHECKS:
        assert any(line.startswith(f"PASS {check} (") for line in printed.splitlines()), printed
    assert f"summary: {len(CHECKS)} passed, 0 failed" in printed
    assert "generated tokens/s" in printed and "TRL GRPO:" in printed
    assert json.load(open(out / "audit" / "audit.json"))["config"]["device"] == "cpu"
    assert os.listdir(cwd) == [] and not (tmp_path / "unused-cache").exists()  # only OUT_DIR was written


def test_the_audit_plot_draws_a_metric_no_trace_gives(tmp_path):
    """Found by the dry run: an audit whose traces have no labelled first error failed in its plot."""
    row = {"spearman": 0.1, "first_error_top1": math.nan, "cost_vs_grpo_step": 0.0}
    plot_audit({"methods": {"grpo": row, "vineppo": {**row, "cost_vs_grpo_step": 4.0}}}, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").stat().st_size > 0
