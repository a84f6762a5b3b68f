"""Smaller trust items of issue 42 (item 9): pickled Hugging Face weights are one line saying to convert them;
the --set error's own example is accepted by --set; YAML errors keep their line and column; a UTF-8 jsonl with
a byte-order mark is read."""

from __future__ import annotations

import json
import os

import pytest
import torch

from credo.cli.main import main
from credo.tasks import make_task
from builders import Payload, build_tokenizer, one_line_error, snapshot, tiny_llama

COMMANDS = ["train", "sft", "audit", "eval", "compare", "show"]


def pickled_model(folder, weights) -> str:
    """A Hugging Face model directory (config, tokenizer) whose only weights are `weights`, pickled."""
    tokenizer = build_tokenizer()
    tiny_llama(tokenizer).config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.save(weights, os.path.join(folder, "pytorch_model.bin"))
    return str(folder)


@pytest.mark.parametrize("kind", ["tensors", "code"])
def test_pickled_weights_are_one_line_saying_to_convert_them(tmp_path, capsys, kind):
    """Plain tensors (transformers' restricted loader would read them) and a pickle that runs code (it refuses
    it with a long traceback) alike: credo reads neither, and says so in one line."""
    marker = tmp_path / "ran"
    weights = tiny_llama(build_tokenizer()).state_dict() if kind == "tensors" else Payload(str(marker))
    model = pickled_model(tmp_path / "model", weights)
    before = snapshot(str(tmp_path))
    for argv in (["eval", "--checkpoint", model, "--task", "gym:chain_sum", "--n", "1"],
                 ["show", "--checkpoint", model, "--task", "gym:chain_sum", "--out", str(tmp_path / "out")],
                 ["train", "--start", model, "--task", "gym:chain_sum", "--out", str(tmp_path / "out")]):
        line = one_line_error(capsys, argv + ["--quiet"])
        assert "pytorch_model.bin holds pickled PyTorch weights" in line and "convert them to safetensors" in line
    assert not marker.exists() and snapshot(str(tmp_path)) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_the_set_errors_own_example_is_accepted(command, capsys):
    line = one_line_error(capsys, [command, "--set", "lr"])
    assert line.startswith(f"credo {command}: error: override 'lr' must look like key=value (e.g. --set ")
    example = line.split("(e.g. --set ")[1].rstrip(")")
    assert main([command, "--set", example, "--help-config"]) == 0  # accepted: an unknown field would exit 2
    assert f"\n{example.split('=')[0].split('.')[0]} = " in capsys.readouterr().out  # a field of the listing


@pytest.mark.parametrize("text, where", [
    ("lr: [1e-5\nsteps: 3\n", "line 2, column 6: expected ',' or ']', but got ':'"),
    ("lr: 1\n steps: 2\n", "line 2, column 7: mapping values are not allowed")])
def test_a_yaml_error_keeps_its_line_and_column(tmp_path, capsys, text, where):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    line = one_line_error(capsys, ["train", "--config", str(config), "--out", str(tmp_path / "run")])
    assert f"config file {config} is not valid YAML ({where}" in line


def test_a_set_value_that_is_not_yaml_says_where(capsys):
    line = one_line_error(capsys, ["train", "--set", "lr=[1", "--out", "x"])
    assert "--set lr: '[1' is not valid YAML (line 1, column 3: expected ',' or ']'" in line


def test_a_utf8_jsonl_with_a_byte_order_mark_is_read(tmp_path):
    rows = [json.dumps({"question": f"{i}+{i}=", "answer": str(2 * i)}) for i in range(12)]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(rows).encode() + b"\n")
    task = make_task(f"jsonl:{path}")
    problems = {p.prompt: p for p in task.heldout + task.train}
    assert set(problems) == {f"{i}+{i}=" for i in range(12)} and problems["0+0="].data["line"] == 1
