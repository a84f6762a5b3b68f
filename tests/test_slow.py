"""End-to-end checks that take minutes: `make test-slow` (not part of `make test`)."""

import json
import math
import os

import pytest

from credo.cli.main import main

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("method", ["grpo", "rredcot", "sc_grpo"])
def test_smollm2_trains_on_reasoning_gym(tmp_path, method):
    pytest.importorskip("gguf")
    out = str(tmp_path / method)
    args = ["train", "--start", "smollm2-135m", "--task", "gym:chain_sum", "--method", method, "--steps", "5",
            "--out", out, "--quiet", "--set", "prompts_per_step=2", "--set", "group_size=4",
            "--set", "sampling.max_new_tokens=48", "--set", "eval_n=4", "--set", "final_eval_n=4", "--set", "epochs=1",
            "--set", "task_options.min_digits=1", "--set", "task_options.max_digits=1"]
    assert main(args) == 0
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]  # the start's evaluation, then one row per step
    assert all(math.isfinite(r["loss"]) for r in rows[1:])  # every step logged a loss, and it is finite


def test_sft_train_eval_gain_on_the_default_preset(tmp_path, capsys):
    """The first claim, end to end: GRPO from the shipped SFT start raises held-out accuracy."""
    out = str(tmp_path / "grpo")
    assert main(["train", "--method", "grpo", "--out", out, "--quiet"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    start = float(line.split("start_accuracy=")[1].split()[0])
    final = float(line.split("final_accuracy=")[1].split()[0])
    assert final > start
