"""Smaller trust items: pickled Hugging Face weights are one line saying to convert them;
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


def nested_spec(depth: int) -> str:
    """A method wrapping methods `depth` deep: entropy_mask of tempo of entropy_mask of ..."""
    names = ["tempo", "entropy_mask"]
    return ":".join(["entropy_mask"] + ["options." * i + "of=" + names[i % 2] for i in range(depth)])


BAD_SPECS = [("rredcot:lam=0.5:lam=0.9", "option 'lam' is given twice"),
             ("rredcot::lam=0.5", "option '' must look like key=value"),
             ("shuffled:of=grpo:of=rloo", "option 'of' is given twice"),
             (nested_spec(40), "wraps methods 40 deep, over the limit of 8")]


@pytest.mark.parametrize("spec, says", BAD_SPECS, ids=["repeated", "empty", "of-twice", "nested"])
@pytest.mark.parametrize("command", ["train --method", "audit --methods", "compare --methods", "show --methods"])
def test_a_malformed_method_spec_is_the_same_one_line_at_every_entry_point(tmp_path, capsys, spec, says, command):
    line = one_line_error(capsys, [*command.split(), spec, "--out", str(tmp_path / "out"), "--quiet"])
    assert says in line
    assert not os.path.exists(tmp_path / "out")


def test_methods_nested_hundreds_deep_in_a_config_file_are_one_line(tmp_path, capsys):
    """Each wrapper level checks and builds the next: 300 levels exhausted Python's recursion (a traceback)."""
    credit: dict = {"of": "grpo"}
    for i in range(300):
        credit = {"of": ["entropy_mask", "tempo"][i % 2], "options": credit}
    config = tmp_path / "deep.yaml"
    config.write_text(json.dumps({"method": "entropy_mask", "credit": credit}))
    line = one_line_error(capsys, ["train", "--config", str(config), "--out", str(tmp_path / "out"), "--quiet"])
    assert "train.credit.options: entropy_mask wraps methods 301 deep, over the limit of 8" in line
    from credo.credit.compose import wrapping_depth
    assert wrapping_depth({}) == 1 and wrapping_depth({"of": "rredcot"}) == 2
    assert wrapping_depth({"of": "a", "options.of": "b"}) == wrapping_depth({"of": "a", "options": {"of": "b"}}) == 3


@pytest.mark.parametrize("method, field", [("srpo:localiser=prompt", "train.reset.localiser"),
                                           ("prefix_shaping:localiser=prompt", "train.credit.localiser")])
def test_the_prompt_localiser_on_a_start_that_cannot_read_the_request_is_refused_before_the_run(tmp_path, capsys,
                                                                                                 method, field):
    """The shipped arith start's alphabet lacks the request's letters: refused before --out, not at step 1."""
    line = one_line_error(capsys, ["train", "--method", method, "--steps", "1", "--out", str(tmp_path / "out"),
                                   "--quiet"])
    assert f"{field}=prompt needs a policy that can read the task's localisation request" in line
    assert not os.path.exists(tmp_path / "out")


def test_the_prompt_localiser_is_accepted_on_a_start_that_reads_the_request(tmp_path):
    from credo.policy.gpt import GPTConfig
    from credo.policy.tiny import TinyPolicy
    from credo.strategies.localisers import check_can_ask
    from credo.train.sft import make_tokenizer
    from credo.train.sft_config import sft_config_for
    tokenizer = make_tokenizer(sft_config_for("arith-long-skilled"))
    policy = TinyPolicy.create(GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=1, d_model=16, n_head=2), tokenizer)
    check_can_ask(policy, make_task("arith-long"), "train.reset.localiser")  # no error
    with pytest.raises(ValueError, match="task 'gym:chain_sum' has none"):
        check_can_ask(policy, type("NoRequest", (), {"name": "gym:chain_sum"})(), "train.reset.localiser")
