"""Shared fixtures: tiny models built from a config, never downloaded (their builders: builders.py)."""

from __future__ import annotations

import os

import pytest
import torch

from builders import CHAIN_SUM_OPTIONS, WIDE_INIT, build_tokenizer, chain_sum_rollouts, save_tiny_llama, tiny_llama
from builders import tiny_policy
from credo.policy.tiny import TinyPolicy

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CREDO_CACHE", str(tmp_path_factory.getbasetemp() / "credo-cache"))


@pytest.fixture
def policy() -> TinyPolicy:
    return tiny_policy()


@pytest.fixture
def saved_policy(tmp_path) -> str:
    path = os.path.join(tmp_path, "start")
    tiny_policy().save(path)
    return path


@pytest.fixture(scope="module")
def hf_policy():
    """A chat HFPolicy of tiny_llama (build_tokenizer's tokenizer)."""
    from credo.policy.hf import HFPolicy
    tokenizer = build_tokenizer()
    return HFPolicy(tiny_llama(tokenizer), tokenizer, chat=True)


@pytest.fixture(scope="module")
def gym_task():
    """reasoning-gym's chain_sum with 2-3 one-digit terms."""
    from credo.tasks import make_task
    return make_task("gym:chain_sum", CHAIN_SUM_OPTIONS)


@pytest.fixture(scope="module")
def hf_setup():
    """(policy, task, rollouts): a chat tiny_llama of wide init bound to gym:chain_sum, and chain_sum_rollouts
    of it (16 rows, 4 groups)."""
    from credo.policy import bind_task
    from credo.policy.hf import HFPolicy
    from credo.tasks import make_task
    tokenizer = build_tokenizer()
    # wide init: with the default 0.02 the model's logits barely depend on context, SC-GRPO's KL is ~1e-6
    # (float32 noise) and every comparison below would compare noise
    model = tiny_llama(tokenizer, init_range=WIDE_INIT).eval()
    task = make_task("gym:chain_sum", CHAIN_SUM_OPTIONS)
    policy = bind_task(HFPolicy(model, tokenizer, chat=True), task)
    return policy, task, chain_sum_rollouts(policy, task)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    """A tiny random Llama saved as a credo HF checkpoint (policy.json + config.json)."""
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny-hf") / "model"))
