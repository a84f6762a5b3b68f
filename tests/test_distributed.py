"""Data parallelism: a 2-process run (gloo on CPU) ends with the same weights as a 1-process run."""

import os
import subprocess
import sys

import pytest

import torch
from safetensors.torch import load_file


def launch(n, out, start, port):
    # this checkout's source before any installed credo, and the tests folder (dp_worker imports builders)
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([src, os.path.dirname(__file__)])}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={port}",
           os.path.join(os.path.dirname(__file__), "dp_worker.py"), out, start]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_match_one(saved_policy, tmp_path):
    launch(1, str(tmp_path / "one"), saved_policy, 29511)
    launch(2, str(tmp_path / "two"), saved_policy, 29512)
    a = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    start = load_file(os.path.join(saved_policy, "model.safetensors"))
    assert any(not torch.equal(a[k], start[k]) for k in a), "the run never updated the weights"
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
