"""examples/gpu/acceptance.sh --dry-run: every check of both parts of the GPU acceptance script (the smoke and the
full check) passes on the CPU with tiny settings and a tiny random Llama built from a config (in place of SmolLM2),
writing only under its OUT_DIR, with what to keep in OUT_DIR/results/."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from credo.lab.audit.report import plot_audit

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPT = os.path.join(ROOT, "examples", "gpu", "acceptance.sh")
CHECKS = ("sft", "audit", "compare", "trl", "verl")
SMOKE_CHECKS = ("smoke", "train-tiny", "train-hf", "trl")
SMOKE_PARTS = ("device", "bfloat16", "sample", "credit")


def dry_run(tmp_path, *flags: str) -> tuple[str, str]:
    """(what the script printed, OUT_DIR) of a dry run from an empty working directory."""
    out, cwd = tmp_path / "acceptance", tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "CREDO": os.path.join(os.path.dirname(sys.executable), "credo"),
           "PYTHONPATH": os.path.join(ROOT, "src"), "CREDO_CACHE": str(tmp_path / "unused-cache")}
    env.pop("OUT", None)
    done = subprocess.run(["bash", SCRIPT, "--dry-run", *flags, str(out)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert os.listdir(cwd) == [] and not (tmp_path / "unused-cache").exists()  # only OUT_DIR was written
    return done.stdout, str(out)


@pytest.mark.slow  # sft, audit, compare, TRL and verl each in a process of its own (~2 min); each is tested alone
def test_the_acceptance_dry_run_passes_every_check_and_writes_only_under_its_out_dir(tmp_path):
    printed, out = dry_run(tmp_path)
    for check in CHECKS:
        assert any(line.startswith(f"PASS {check} (") for line in printed.splitlines()), printed
    assert f"summary (full): {len(CHECKS)} passed, 0 failed" in printed
    assert "generated tokens/s" in printed and "TRL GRPO:" in printed
    assert json.load(open(os.path.join(out, "audit", "audit.json")))["config"]["device"] == "cpu"
    results = os.path.join(out, "results")  # what goes to docs/results/gpu/
    assert sorted(os.listdir(results)) == ["audit.json", "compare-results.json", "full.txt"]
    assert f"summary (full): {len(CHECKS)} passed" in open(os.path.join(results, "full.txt")).read()


@pytest.mark.slow
def test_the_smoke_dry_run_checks_placement_dtype_throughput_credit_and_one_step_of_each_backend(tmp_path):
    printed, out = dry_run(tmp_path, "--smoke")
    lines = printed.splitlines()
    for check in SMOKE_CHECKS:
        assert any(line.startswith(f"PASS {check} (") for line in lines), printed
    for part in SMOKE_PARTS:  # smoke.py's own lines, indented under its check
        assert any(line.startswith(f"  PASS {part} (") for line in lines), printed
    assert f"summary (smoke): {len(SMOKE_CHECKS)} passed, 0 failed" in printed and "TRL GRPO:" in printed
    found = json.load(open(os.path.join(out, "results", "smoke.json")))
    assert found["setup"]["device"] == "cpu" and found["setup"]["dtype"] == "float32"
    assert all(found["checks"][part]["passed"] for part in SMOKE_PARTS)
    assert found["checks"]["sample"]["generated_tokens_per_s"] > 0
    assert set(found["checks"]["credit"]["seconds"]) == {"grpo", "rloo", "rredcot"}
    for run in ("train-tiny", "train-hf"):  # one step each, logged
        assert os.path.isfile(os.path.join(out, run, "summary.json")), run


def test_the_audit_plot_draws_a_metric_no_trace_gives(tmp_path):
    """Found by the dry run: an audit whose traces have no labelled first error failed in its plot."""
    row = {"spearman": 0.1, "first_error_top1": math.nan, "cost_vs_grpo_step": 0.0}
    plot_audit({"methods": {"grpo": row, "vineppo": {**row, "cost_vs_grpo_step": 4.0}}}, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").stat().st_size > 0
