"""The corpus of malformed inputs (tests/data/corpus.yaml): each gives its one-line error, exit 2, and
changes no file that existed before; the --out it names never appears. Hugging Face models ({hf}, {pickled})
are built here from a config, once, and copied beside the data of the cases that name them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from credo.cli.main import build_parser, main
from credo.policy.hf import HFPolicy
from builders import build_tokenizer, one_line_error, snapshot, tiny_llama

DATA = os.path.join(os.path.dirname(__file__), "data")
CASES = yaml.safe_load(open(os.path.join(DATA, "corpus.yaml")))["cases"]


@pytest.fixture
def data_copy(tmp_path):
    folder = str(tmp_path / "data")
    shutil.copytree(DATA, folder)
    return folder


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory) -> dict[str, str]:
    """{'hf': a tiny chat Llama with a context of 128 positions, 'pickled': its config and tokenizer with its
    weights as pytorch_model.bin only}, saved once; cases get copies."""
    root = tmp_path_factory.mktemp("corpus-models")
    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer, max_positions=128)
    HFPolicy(model, tokenizer, chat=True).save(str(root / "hf"))
    model.config.save_pretrained(root / "pickled")
    tokenizer.save_pretrained(root / "pickled")
    torch.save(model.state_dict(), root / "pickled" / "pytorch_model.bin")
    return {"hf": str(root / "hf"), "pickled": str(root / "pickled")}


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["argv"][:3]).replace("{data}/", "") for c in CASES])
def test_malformed_input_gives_its_one_line_error(case, data_copy, saved_policy, hf_models, tmp_path, capsys):
    new = str(tmp_path / "new-out")
    models = {}
    for name, source in hf_models.items():  # copied into tmp_path: the snapshot covers them too
        if "{" + name + "}" in " ".join(case["argv"]):
            models[name] = shutil.copytree(source, str(tmp_path / name))
    names = {"data": data_copy, "start": saved_policy, "new": new, "hf": "", "pickled": "", **models}
    argv = [a.format(**names) for a in case["argv"]] + ["--quiet"]
    before = snapshot(str(tmp_path))
    line = one_line_error(capsys, argv)
    assert case["expect"].replace("{data}", data_copy) in line
    assert not os.path.exists(new)
    assert snapshot(str(tmp_path)) == before


def test_corpus_covers_every_kind():
    joined = [" ".join(c["argv"]) for c in CASES]
    for kind in ("/configs/", "/jsonl/", "/runs/", "/checkpoints/"):
        assert sum(kind in j for j in joined) >= 1, kind
    assert len(CASES) >= 50


def test_traceback_only_with_credo_debug(tmp_path):
    argv = [sys.executable, "-m", "credo.cli", "eval", "--n", "0", "--quiet"]
    quiet = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "CREDO_DEBUG": "0"})
    assert quiet.returncode == 2 and quiet.stderr.strip() == "credo eval: error: eval --n must be >= 1, got 0"
    loud = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "CREDO_DEBUG": "1"})
    assert loud.returncode == 1 and "Traceback" in loud.stderr and "ConfigError" in loud.stderr


def test_internal_key_error_is_a_bug_not_a_user_error(monkeypatch, saved_policy, tmp_path):
    import credo.cli.methods

    def broken(args):
        raise KeyError("minibatch_rng")

    monkeypatch.setattr(credo.cli.methods, "cmd_methods", broken)
    with pytest.raises(KeyError, match="minibatch_rng"):
        main(["methods"])


def test_set_help_example_is_accepted(saved_policy, tmp_path, capsys):
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    example = "--set lr=1e-5 --set loss.eps_high=0.28"
    assert example in " ".join(help_text.split())
    out = str(tmp_path / "run")
    args = ["train", "--start", saved_policy, "--steps", "1", "--out", out, "--quiet", *example.split(),
            "--set", "eval_n=2", "--set", "final_eval_n=2", "--set", "prompts_per_step=2", "--set", "group_size=2",
            "--set", "sampling.max_new_tokens=8"]
    assert main(args) == 0
    config = yaml.safe_load(open(os.path.join(out, "config.yaml")))
    assert config["lr"] == 1e-5 and config["loss"]["eps_high"] == 0.28


def test_eval_with_k_shows_progress(saved_policy, capsys):
    assert main(["eval", "--checkpoint", saved_policy, "--n", "3", "--k", "2", "--max-new-tokens", "4"]) == 0
    err = capsys.readouterr().err
    assert "eval greedy (3)" in err and "eval 2 samples x 3" in err
