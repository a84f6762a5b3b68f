"""`arith-long`: a registered task preset with its own SFT preset, held-out split and default start."""

import os

import pytest

from credo.core.config import ConfigError, config_hash
from credo.train.sft import packaged_start
from credo.train.sft_config import sft_config_for
from credo.tasks import make_task


def test_arith_long_is_registered_with_long_one_digit_chains():
    task = make_task("arith-long")
    assert task.name == "arith-long"
    problems = task.heldout_problems(200)
    n_terms = [len(p.data["terms"]) for p in problems]
    assert min(n_terms) == 8 and max(n_terms) == 12
    assert all(0 <= t <= 9 for p in problems for t in p.data["terms"])
    assert all(task.is_heldout(p) for p in problems)
    # the reference solution is correct under the same step-truth rule
    assert all(task.step_truth(p, task.solution(p)).first_error is None for p in problems[:20])


def test_arith_long_options_override_single_fields_and_are_checked():
    task = make_task("arith-long", {"max_terms": 9})
    assert (task.config.min_terms, task.config.max_terms, task.config.digits) == (8, 9, 1)
    with pytest.raises(ConfigError, match="task.min_terms/max_terms"):
        make_task("arith-long", {"max_terms": 13})


def test_each_task_has_its_own_heldout_set():
    short, long = make_task("arith").heldout_problems(50), make_task("arith-long").heldout_problems(50)
    assert not {p.key for p in short} & {p.key for p in long}


def test_sft_preset_follows_the_task():
    assert sft_config_for("arith") == sft_config_for("gym:leg_counting")  # other tasks start from arith's policy
    long = sft_config_for("arith-long")
    assert long.task == make_task("arith-long").config
    assert config_hash(long) != config_hash(sft_config_for("arith"))
    assert packaged_start(sft_config_for("arith")) is not None


def test_default_start_of_arith_long_is_its_packaged_start_unpacked_into_the_cache():
    import lzma
    from credo.core.files import cache_root
    from credo.policy.tiny import TinyPolicy
    from credo.train.sft import ensure_sft
    digest = config_hash(sft_config_for("arith-long"))
    path = ensure_sft(task="arith-long", progress=False)  # the test cache is empty: the packaged copy, unpacked
    assert path == os.path.join(cache_root(), "sft", digest)
    shipped = packaged_start(sft_config_for("arith-long"))
    assert shipped.endswith("sft-" + digest) and not os.path.exists(os.path.join(shipped, "model.safetensors"))
    with open(os.path.join(shipped, "model.safetensors.xz"), "rb") as f, \
            open(os.path.join(path, "model.safetensors"), "rb") as g:
        assert lzma.decompress(f.read()) == g.read()  # the shipped weights, byte for byte
    assert TinyPolicy.load(path).model.config.d_model == 256
    assert ensure_sft(task="arith", progress=False) != path
    assert ensure_sft(task="arith-long", progress=False) == path  # unpacked once, then read from the cache
