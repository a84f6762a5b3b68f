"""The skilled SFT mixture: solution-in-context and localisation examples in the formats the methods use."""

import os
import random
from collections import Counter

import pytest
import torch

from credo.core.config import ConfigError, config_hash, from_dict, to_dict
from credo.credit.sc_grpo import teacher_prompt
from credo.train.sft import example_kind, make_tokenizer, packaged_start, sft_example
from credo.train.sft_config import SFTConfig, sft_config_for
from credo.strategies.localisers import parse_step
from credo.tasks.arith import ALPHABET, PRESETS, ArithTask
from credo.tasks.arith_skills import corrupted_lines, localisation_example


@pytest.fixture(scope="module")
def task():
    return ArithTask(PRESETS["arith-long"], "arith-long")


@pytest.fixture(scope="module")
def problems(task):
    return task.train_problems(300, torch.Generator().manual_seed(3))


def test_corrupted_line_is_the_first_and_only_error(task, problems):
    rng = random.Random(0)
    for problem in problems:
        n = len(task.solution_lines(problem))
        line = rng.randrange(n)
        lines = corrupted_lines(task, problem, line, rng)
        truth = task.step_truth(problem, "\n".join(lines))
        assert truth.first_error == line
        assert truth.correct.count(False) == 1  # later lines carry the slip forward correctly
        assert all(not part.startswith("-") for text in lines for part in text.replace("=", " ").split())


def test_localisation_example_is_the_request_the_localiser_sends_with_a_target_the_parser_reads(task, problems):
    rng = random.Random(1)
    seen = Counter()
    for problem in problems:
        request, target = localisation_example(task, problem, rng, right_share=0.2)
        body = request[len(problem.prompt):].split("\n")[:-2]  # the numbered steps
        steps = [line.split(": ", 1)[1] for line in body]
        pieces = [s + "\n" for s in steps[:-1]] + steps[-1:]
        assert request == task.localisation_prompt(problem, pieces)
        first = task.step_truth(problem, "".join(pieces)).first_error
        if first is None:
            assert target == "Step 0"
        else:
            assert parse_step(target, len(pieces)) == (first, "prose")
        seen[first is None] += 1
    assert 0.1 < seen[True] / len(problems) < 0.3


def test_reference_example_is_exactly_sc_grpos_teacher_context(task, problems):
    config = sft_config_for("arith-long-skilled")
    policy_stub = type("P", (), {"model": None})()  # no context length: the teacher context is never cut
    problem = problems[0]
    context, target = sft_example(task, problem, "reference", random.Random(0))
    assert context == teacher_prompt(task, policy_stub, problem, task.solution(problem), 96, None, 0)
    assert target == task.solution(problem)
    assert config.reference_frac == 0.5 and config.localisation_frac == 0.2


def test_skilled_alphabet_reads_the_request_and_the_first_start_keeps_its_own(task, problems):
    skilled = make_tokenizer(sft_config_for("arith-long-skilled"))
    request, target = localisation_example(task, problems[0], random.Random(0), 0.0)
    skilled.encode(request + target)  # every character is in the alphabet
    assert make_tokenizer(sft_config_for("arith-long")).alphabet == ALPHABET
    with pytest.raises(ValueError):
        make_tokenizer(sft_config_for("arith-long")).encode(request)
    assert set(skilled.banned_in_sampling) == set("?|")


def test_new_fields_keep_the_first_starts_hash_and_asset():
    first = sft_config_for("arith-long")
    assert "localisation_frac" not in to_dict(first)
    assert config_hash(first) == "8b4267909737" and packaged_start(first) is not None
    assert sft_config_for("arith-long-first") == first
    assert config_hash(sft_config_for("arith-long-skilled")) != config_hash(first)


def test_example_kinds_follow_the_shares():
    config = sft_config_for("arith-long-skilled")
    rng = random.Random(0)
    counts = Counter(example_kind(rng.random(), config) for _ in range(20000))
    assert abs(counts["localise"] / 20000 - 0.2) < 0.015 and abs(counts["reference"] / 20000 - 0.5) < 0.015
    assert abs(counts["early"] / 20000 - 0.1) < 0.015


@pytest.mark.parametrize("values, field", [({"localisation_frac": 0.8}, "localisation_frac"),
                                           ({"localisation_frac": -0.1}, "localisation_frac"),
                                           ({"localisation_right_frac": 1.5}, "localisation_right_frac")])
def test_shares_are_range_checked(values, field):
    with pytest.raises(ConfigError, match=field):
        from_dict(SFTConfig, values, prefix="sft.")


def test_init_copies_a_start_and_keeps_fresh_rows_for_new_characters(tmp_path):
    from dataclasses import replace
    from credo.policy.gpt import GPTConfig
    from credo.policy.tiny import TinyPolicy
    from credo.train.sft import initialise_from, make_tokenizer
    small = GPTConfig(n_layer=1, d_model=16, n_head=2, max_len=64)
    old_tok, new_tok = make_tokenizer(), make_tokenizer(sft_config_for("arith-long-skilled"))
    source = TinyPolicy.create(replace(small, vocab_size=old_tok.vocab_size), old_tok, seed=1)
    source.save(str(tmp_path / "src"))
    target = TinyPolicy.create(replace(small, vocab_size=new_tok.vocab_size), new_tok, seed=2)
    fresh = target.model.tok_emb.weight.detach().clone()
    initialise_from(target, str(tmp_path / "src"))
    rows = old_tok.vocab_size
    assert torch.equal(target.model.tok_emb.weight[:rows], source.model.tok_emb.weight)
    assert torch.equal(target.model.tok_emb.weight[rows:], fresh[rows:])
    assert torch.equal(target.model.blocks[0].mlp[0].weight, source.model.blocks[0].mlp[0].weight)
    wider = TinyPolicy.create(replace(small, d_model=32, vocab_size=new_tok.vocab_size), new_tok)
    with pytest.raises(ConfigError, match="sft.init"):
        initialise_from(wider, str(tmp_path / "src"))
    with pytest.raises(ConfigError, match="sft.init"):
        from_dict(SFTConfig, {"init": "nope"}, prefix="sft.")


def test_named_starts_resolve_by_name_and_refuse_another_tasks_or_an_unknown_one():
    from credo.train.starts import resolve_checkpoint
    from credo.core.files import cache_root
    first = resolve_checkpoint("sft:arith-long-first", "audit.checkpoint", task="arith-long", progress=False)
    assert first == os.path.join(cache_root(), "sft", config_hash(sft_config_for("arith-long")))  # unpacked
    assert resolve_checkpoint("sft:arith-long", "x", task="arith-long", progress=False) == first  # the task's default
    band = resolve_checkpoint("sft:arith-long-skilled-band", "x", task="arith-long", progress=False)
    assert band == os.path.join(cache_root(), "sft", config_hash(sft_config_for("arith-long-skilled-band")))
    # shipped: the starts a preset uses (the long-skilled preset's is the band start); the superseded skilled
    # start is rebuilt from its recipe when asked for (75 minutes), so it is not resolved here
    assert packaged_start(sft_config_for("arith-long-skilled-band")) is not None
    assert packaged_start(sft_config_for("arith-long-skilled")) is None
    with pytest.raises(ConfigError, match="^audit.checkpoint: no SFT start named 'nope'"):
        resolve_checkpoint("sft:nope", "audit.checkpoint", task="arith-long", progress=False)
    with pytest.raises(ConfigError, match="^train.start: the start sft:arith-long-skilled is trained on arith-long"):
        resolve_checkpoint("sft:arith-long-skilled", "train.start", task="arith", progress=False)


def test_snapshots_keep_every_validation_checks_policy_and_keep_last_ships_the_last(tmp_path):
    """sft.keep=last ships the last step's weights even when an earlier check scored higher; --snapshots keeps the
    policy of every check (step-N), the last one equal to the shipped start; keep is range-checked."""
    from dataclasses import replace
    from credo.policy.gpt import GPTConfig
    from credo.policy.tiny import TinyPolicy
    from credo.train.sft import train_sft
    config = replace(SFTConfig(), model=GPTConfig(n_layer=1, d_model=16, n_head=2, max_len=64), max_steps=3,
                     batch_size=4, eval_every=1, eval_n=2, warmup_steps=1, target_accuracy=1.0, keep="last")
    summary = train_sft(config, str(tmp_path / "start"), progress=False, snapshots=str(tmp_path / "snap"))
    assert sorted(os.listdir(tmp_path / "snap")) == ["step-1", "step-2", "step-3"]
    assert summary["step"] == 3
    shipped, last = TinyPolicy.load(str(tmp_path / "start")), TinyPolicy.load(str(tmp_path / "snap" / "step-3"))
    first = TinyPolicy.load(str(tmp_path / "snap" / "step-1"))
    for name, value in shipped.model.state_dict().items():
        assert torch.equal(value, last.model.state_dict()[name])
    assert not torch.equal(shipped.model.tok_emb.weight, first.model.tok_emb.weight)
    with pytest.raises(ConfigError, match="sft.keep"):
        from_dict(SFTConfig, {"keep": "first"}, prefix="sft.")


def test_copy_examples_hold_a_scrambled_solution_in_the_teachers_context_and_ask_for_that_text(task, problems):
    """Only copying predicts the target: its results are not the task's (so computing past the context fails),
    its lines keep the solution's form (each left operand carries the line before), and the context is exactly
    SC-GRPO's teacher context around that text."""
    from credo.tasks.arith_skills import scrambled_solution
    rng = random.Random(0)
    for problem in problems[:100]:
        context, target = sft_example(task, problem, "copy", rng)
        assert context == task.reference_prompt(problem, target)
        lines = target.split("\n")
        assert len(lines) == len(task.solution_lines(problem)) and lines[-1].startswith("#### ")
        for before, line in zip(lines, lines[1:-1]):
            assert line.startswith(before.split("=")[1]) and int(line.split("=")[1]) >= 0
        assert target != task.solution(problem)  # computing it gets it wrong: only copying predicts it
        assert len(target) <= len(task.solution(problem))  # fits wherever the reference example fits
    assert scrambled_solution(problems[0], random.Random(1)) == scrambled_solution(problems[0], random.Random(1))
    config = replace_config(copy_frac=0.25)
    counts = Counter(example_kind(u / 1000, config) for u in range(1000))
    assert counts["copy"] == 250
    with pytest.raises(ConfigError, match="copy_frac"):
        replace_config(copy_frac=0.9)


def replace_config(**changes) -> SFTConfig:
    from dataclasses import replace
    return replace(sft_config_for("arith-long-skilled-2"), **changes)
