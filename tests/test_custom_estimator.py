"""examples/custom_estimator.py, as docs/architecture.md's "Where to add" sends a newcomer to it: an estimator
registered outside the package trains two steps, and its option reaches the run's record."""

import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_the_custom_estimator_example_trains_two_steps(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "custom_estimator.py"), str(run)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed["step"] == 2 and printed["credit"] == {"scale": 0.25}
    recorded = yaml.safe_load(open(run / "config.yaml"))
    assert recorded["method"] == "scaled_grpo" and recorded["credit"] == {"scale": 0.25}
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    assert os.path.isfile(run / "summary.json")
