"""No code runs from a run directory or the cache; checkpoints verify; huge prompts are refused up front."""

from __future__ import annotations

import ast
import io
import json
import os
import shutil

import pytest
import torch

from credo.core.config import UserError
from credo.lab.audit.cache import load_cached
from credo.core.state_io import CorruptStateError, write_manifest
from credo.tasks import make_task
from credo.train.trainer import Trainer
from conftest import tiny_policy
from builders import (audit_cache_entry, killed_run, malicious_pickle, one_line_error, payload_is_live, snapshot,
                      train_config)


def checkpoint_of(run_dir) -> str:
    folder = os.path.join(run_dir, "checkpoints")
    return os.path.join(folder, sorted(os.listdir(folder))[-1])


@pytest.fixture(scope="module")
def killed_template(tmp_path_factory):
    root = tmp_path_factory.mktemp("killed")
    start = str(root / "start")
    tiny_policy().save(start)
    killed_run(start, str(root / "run"))
    return str(root)


@pytest.fixture
def killed(killed_template, tmp_path):
    """A copy of a run stopped after step 3 (checkpoint at step 2); its config points at the template's start."""
    run = str(tmp_path / "run")
    shutil.copytree(os.path.join(killed_template, "run"), run)
    return run


@pytest.mark.parametrize("where",
                         ["trainer_state.pt", "trainer_state.safetensors", "model.safetensors", "adapter_state.pt",
                                   "trainer_state.json"])
def test_planted_pickle_in_a_checkpoint_is_refused_and_never_run(killed, saved_policy, tmp_path, capsys, where):
    assert payload_is_live(tmp_path)
    marker = str(tmp_path / "pwned")
    checkpoint = checkpoint_of(killed)
    malicious_pickle(os.path.join(checkpoint, where), marker)
    write_manifest(checkpoint)  # the attacker makes the manifest agree: the loader must still refuse
    before = snapshot(killed)
    line = one_line_error(capsys, ["train", "--resume", killed, "--quiet"])
    assert where in line
    assert not os.path.exists(marker)
    assert snapshot(killed) == before


def test_checkpoint_holds_no_pickle_and_a_manifest(killed):
    checkpoint = checkpoint_of(killed)
    names = sorted(os.listdir(checkpoint))
    assert names == ["manifest.json", "model.safetensors", "policy.json", "trainer_state.json",
                     "trainer_state.safetensors"]
    listed = json.load(open(os.path.join(checkpoint, "manifest.json")))["sha256"]
    assert sorted(listed) == [n for n in names if n != "manifest.json"]


@pytest.mark.parametrize("damage", ["flip", "missing_manifest", "extra_file", "deleted"])
def test_damaged_checkpoint_names_the_file(killed, saved_policy, capsys, damage):
    checkpoint = checkpoint_of(killed)
    weights = os.path.join(checkpoint, "model.safetensors")
    if damage == "flip":
        data = bytearray(open(weights, "rb").read())
        data[-7] ^= 0x40  # one bit of one weight
        open(weights, "wb").write(bytes(data))
        expect = "model.safetensors does not match its sha256"
    elif damage == "missing_manifest":
        os.remove(os.path.join(checkpoint, "manifest.json"))
        expect = "has no manifest.json"
    elif damage == "extra_file":
        open(os.path.join(checkpoint, "notes.txt"), "w").write("hi")
        expect = "notes.txt is not in the checkpoint's manifest"
    else:
        os.remove(os.path.join(checkpoint, "trainer_state.json"))
        expect = "trainer_state.json is listed in the checkpoint's manifest but missing"
    before = snapshot(killed)
    line = one_line_error(capsys, ["train", "--resume", killed, "--quiet"])
    assert expect in line and checkpoint in line
    assert snapshot(killed) == before
    with pytest.raises(CorruptStateError):  # the library refuses too, not only the CLI
        Trainer(train_config(saved_policy), killed, progress=False).restore()


def test_audit_cache_round_trips_without_pickle(tmp_path):
    stem, problems, rollouts, reference = audit_cache_entry(tmp_path)
    assert sorted(os.listdir(os.path.dirname(stem))) == ["abc.json", "abc.safetensors"]
    loaded = load_cached(stem, problems)
    assert torch.equal(loaded["rollouts"].completion_ids, rollouts.completion_ids)
    assert loaded["rollouts"].problems == rollouts.problems and loaded["rollouts"].completions == ["a", "b", "c", "d"]
    assert all(torch.equal(a, b) for a, b in zip(loaded["reference"].values, reference.values))
    assert loaded["trace_tokens"] == 7.5
    with pytest.raises(CorruptStateError, match="not this task's held-out problems"):
        load_cached(stem, list(reversed(problems)))


def test_audit_cache_pickle_is_refused_and_never_run(tmp_path):
    assert payload_is_live(tmp_path)
    stem, problems, _, _ = audit_cache_entry(tmp_path)
    marker = str(tmp_path / "pwned")
    malicious_pickle(stem + ".safetensors", marker)
    malicious_pickle(stem + ".pt", marker)  # the old cache name is never read at all
    with pytest.raises(CorruptStateError, match=r"abc\.safetensors is not a valid safetensors file.*delete"):
        load_cached(stem, problems)
    stem, problems, _, _ = audit_cache_entry(tmp_path)  # a good entry again, then a pickle as its JSON half
    malicious_pickle(stem + ".json", marker)
    with pytest.raises(CorruptStateError, match=r"abc\.json is not valid JSON"):
        load_cached(stem, problems)
    assert not os.path.exists(marker)


def test_oversized_question_is_refused_with_the_limit_before_parsing(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n'
                    + json.dumps({"question": "x" * 5_000_000, "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"big.jsonl:2: row is \d+ bytes, over the limit max_question_chars=16000"):
        make_task(f"jsonl:{path}")
    path.write_text('{"question": "1+1?", "answer": "2"}\n' + json.dumps({"question": "y" * 300, "answer": "1"}) + "\n")
    with pytest.raises(ValueError,
                       match=r"big.jsonl:2: question is 300 characters, over the limit max_question_chars=100"):
        make_task(f"jsonl:{path}", {"max_question_chars": 100})


def custom_code_model(hf_dir: str, folder: str, marker: str, in_file: str) -> str:
    """A copy of `hf_dir` whose `in_file` has an auto_map naming the folder's own module, which creates `marker`
    when imported: what transformers would run after asking "Do you wish to run the custom code?"."""
    shutil.copytree(hf_dir, folder)
    with open(os.path.join(folder, "evil.py"), "w") as f:
        f.write(f"import pathlib\npathlib.Path({marker!r}).touch()\n"
                "from transformers import LlamaConfig as EvilConfig, LlamaForCausalLM as EvilModel\n")
    path = os.path.join(folder, in_file)
    data = json.load(open(path))
    data["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel",
                        "AutoTokenizer": ["evil.EvilTokenizer", None]}
    json.dump(data, open(path, "w"))
    return folder


@pytest.mark.parametrize("in_file", ["config.json", "tokenizer_config.json"])
def test_a_model_folder_naming_its_own_code_is_refused_and_never_run(hf_dir, tmp_path, capsys, monkeypatch, in_file):
    from credo.policy.hf import HFPolicy
    marker = str(tmp_path / "pwned")
    model = custom_code_model(hf_dir, str(tmp_path / "model"), marker, in_file)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10))  # a user (or `yes |`) answering transformers' prompt
    before = snapshot(model)
    for argv in (["eval", "--checkpoint", model, "--task", "gym:chain_sum", "--n", "2", "--quiet"],
                 ["train", "--start", model, "--task", "gym:chain_sum", "--steps", "1", "--out",
                  str(tmp_path / "run"), "--quiet"]):
        line = one_line_error(capsys, argv)
        assert os.path.join(model, in_file) in line and "auto_map" in line
    with pytest.raises(UserError, match="auto_map"):  # the library refuses too
        HFPolicy.from_pretrained(model)
    assert not os.path.exists(marker) and not os.path.exists(tmp_path / "run")
    assert snapshot(model) == before


def test_every_from_pretrained_call_refuses_remote_code():
    """Every transformers from_pretrained call credo makes (library, bench, examples) passes
    trust_remote_code=False, so a folder changed after the auto_map check still cannot prompt or run code."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    calls = 0
    for folder in ("src", "bench", "examples", "scripts"):
        for base, _, files in os.walk(os.path.join(root, folder)):
            for name in (n for n in files if n.endswith(".py")):
                path = os.path.join(base, name)
                for node in ast.walk(ast.parse(open(path).read())):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == "from_pretrained"
                            and getattr(node.func.value, "id", "").startswith("Auto")):
                        calls += 1
                        flags = {k.arg: getattr(k.value, "value", None) for k in node.keywords}
                        assert flags.get("trust_remote_code", True) is False, f"{path}:{node.lineno}"
    assert calls >= 4  # hf.py's two, smollm.py's two at least: the scan sees them


ESCAPE = "{{ ''.__class__.__mro__[1].__subclasses__() }}{% for m in messages %}{{ m.content }}{% endfor %}"


def test_a_chat_template_that_tries_to_leave_the_sandbox_is_one_line(hf_dir, tmp_path, capsys):
    """transformers renders chat templates in jinja2's sandbox, which stops the escape: before, a 52-line
    traceback; now one line naming the model."""
    model = str(tmp_path / "model")
    shutil.copytree(hf_dir, model)
    with open(os.path.join(model, "chat_template.jinja"), "w") as f:
        f.write(ESCAPE)
    before = snapshot(model)
    line = one_line_error(capsys, ["eval", "--checkpoint", model, "--task", "gym:chain_sum", "--n", "2", "--quiet"])
    assert f"the chat template of {model} cannot be rendered (SecurityError: " in line
    assert snapshot(model) == before
