"""Shared fixtures: tiny models built from a config, never downloaded."""

from __future__ import annotations

import os

import pytest
import torch

from credo.policy.gpt import GPTConfig
from credo.policy.tiny import TinyPolicy
from credo.train.sft import make_tokenizer

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path_factory.getbasetemp() / "credo-cache"))


def tiny_policy(seed: int = 0, d_model: int = 32, n_layer: int = 2) -> TinyPolicy:
    tok = make_tokenizer()
    return TinyPolicy.create(GPTConfig(vocab_size=tok.vocab_size, n_layer=n_layer, d_model=d_model, n_head=2,
                                       max_len=128), tok, seed=seed)


@pytest.fixture
def policy() -> TinyPolicy:
    return tiny_policy()


@pytest.fixture
def saved_policy(tmp_path) -> str:
    path = os.path.join(tmp_path, "start")
    tiny_policy().save(path)
    return path
