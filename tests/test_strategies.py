"""Strategies and localisers: one registry each, found by name; the trainer calls the registered strategy;
data parallelism wraps any strategy; the Probe's meter; the run's named random streams."""

import random

import pytest
import torch

from credo import strategies
from credo.cli.main import main
from credo.core.config import ConfigError
from credo.train.distributed import DataParallel, Sharded, group_generator
from credo.core.protocols import SamplingConfig
from credo.core.probe import Probe
from credo.train.streams import SEED_OFFSETS, RandomStreams
from credo.strategies import LOCALISERS, STRATEGIES, SamplingContext, sample_groups
from credo.strategies.localisers import localise
from credo.strategies.resets import ResetConfig
from credo.strategies.sampling import collect_plain
from credo.tasks.arith import ArithTask
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer

SAMPLING = SamplingConfig(max_new_tokens=12)


def context(policy, task, seed=0, step=0, group_size=3):
    g = torch.Generator().manual_seed(seed)
    probe = Probe(policy, task, SAMPLING, torch.Generator().manual_seed(seed + 3))
    return SamplingContext(policy, task, lambda n: task.train_problems(n, g), SAMPLING,
                           torch.Generator().manual_seed(seed), probe, random.Random(seed), group_size, step)


def test_unknown_names_are_errors_naming_them():
    with pytest.raises(ConfigError, match="unknown strategy 'best_of_n'; registered: plain, dynamic, resets"):
        strategies.make("best_of_n")
    with pytest.raises(ConfigError, match="train.strategy must be one of .*got 'best_of_n'"):
        load_train_config(None, ["strategy=best_of_n"])
    with pytest.raises(ConfigError, match="unknown localiser 'first'"):
        LOCALISERS.get("first")
    with pytest.raises(ConfigError, match="reset.localiser must be one of .*got 'first'"):
        ResetConfig(localiser="first")
    with pytest.raises(ConfigError, match="dynamic_max_rounds must be >= 1"):
        strategies.make("dynamic", {"max_rounds": 0})
    with pytest.raises(ConfigError, match="'plain' takes no options"):
        strategies.make("plain", {"k": 2})
    with pytest.raises(ValueError, match="strategy 'plain' is registered twice"):
        strategies.register("plain", "again")(collect_plain)


def test_a_registered_strategy_is_the_one_the_trainer_calls(saved_policy, tmp_path, monkeypatch):
    monkeypatch.setattr(STRATEGIES, "_entries", dict(STRATEGIES._entries))  # registered for this test only
    seen = []

    @strategies.register("first_prompt_only", "plain sampling of the first drawn prompt, repeated")
    def first_prompt_only(ctx, n_prompts, config):
        seen.append((ctx.step, n_prompts, ctx.group_size))
        problem = ctx.draw(n_prompts)[0]
        rollouts = sample_groups(ctx.policy, ctx.task, [problem] * n_prompts, ctx.group_size,
                                 ctx.sampling, ctx.generator)
        return strategies.Collected(rollouts, int(rollouts.completion_mask.sum()), {"distinct_prompts": 1.0})

    config = load_train_config(None,
                               [f"start={saved_policy}", "strategy=first_prompt_only", "steps=2", "prompts_per_step=2",
                                      "group_size=3", "sampling.max_new_tokens=8", "eval_n=2", "final_eval_n=0"])
    trainer = Trainer(config, str(tmp_path / "run"), progress=False)
    trainer.train()
    assert seen == [(0, 2, 3), (1, 2, 3)]
    rows = trainer.log.rows()[1:]
    assert [r["distinct_prompts"] for r in rows] == [1.0, 1.0] and all(r["tokens_generated"] > 0 for r in rows)


def test_the_strategy_cost_is_what_its_localiser_spent(policy):
    task = ArithTask()
    ctx = context(policy, task)
    with ctx.probe.metered() as outer:
        out = strategies.make("resets", ResetConfig(n_fresh=2, n_reset=2, localiser="value")).collect(ctx, 2)
    assert out.details["parents"], "an untrained policy fails: parents are found and localised"
    assert out.cost.tokens_scored > 0 and out.cost == outer  # the value localiser scores through the probe
    plain = strategies.make("plain").collect(context(policy, task), 2)
    assert plain.cost.tokens_scored == plain.cost.tokens_generated == 0


def test_probe_meters_nest_and_count_only_their_block(policy):
    task = ArithTask()
    probe = Probe(policy, task, SAMPLING, torch.Generator().manual_seed(0))
    ids, mask = policy.encode_prompts([p.prompt for p in task.heldout_problems(2)])
    probe.sample(ids, mask)  # outside any meter: counted nowhere below
    with probe.metered() as outer:
        with probe.metered() as inner:
            out = probe.sample(ids, mask)
        probe.score(ids, mask, out.completion_ids, out.completion_mask)
    assert inner.tokens_scored == int(mask.sum()) and inner.tokens_generated == int(out.completion_mask.sum())
    assert outer.tokens_scored == inner.tokens_scored + int(mask.sum() + out.completion_mask.sum())
    assert outer.tokens_generated == inner.tokens_generated


def test_sharding_wraps_any_strategy_and_keeps_each_prompts_groups_apart(policy):
    task = ArithTask()
    dp = DataParallel()  # a world of one process: every prompt is this rank's
    assert dp.world == 1
    ctx = context(policy, task, step=5)
    plain = Sharded(strategies.make("plain"), dp, seed=7).collect(ctx, 3)
    assert plain.rollouts.group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    problems = task.train_problems(3, torch.Generator().manual_seed(0))
    alone = sample_groups(policy, task, [problems[1]], 3, SAMPLING, group_generator(7, 5, 1))
    assert torch.equal(plain.rollouts.completion_ids[3:6, :alone.completion_ids.shape[1]], alone.completion_ids)
    resets = Sharded(strategies.make("resets", ResetConfig(n_fresh=2, n_reset=2)), dp,
                     seed=7).collect(context(policy, task), 3)
    groups = resets.rollouts.group
    for i in range(3):  # prompt i's Group 1 is i, its Group 2 (when it found a parent) i + 3
        rows = [j for j, p in enumerate(resets.rollouts.problems) if p.prompt == problems[i].prompt]
        assert set(groups[rows].tolist()) <= {i, i + 3} and i in groups[rows].tolist()
    assert {"reset_fallbacks", "fresh_draws_per_prompt", "mixed_groups"} <= set(resets.info)
    with pytest.raises(ValueError, match="draw only the prompt"):
        Sharded(strategies.make("dynamic", {"max_rounds": 3}), dp,
                seed=7).collect(context(policy, task, group_size=2), 2)


def test_localisers_are_registered_and_found_by_name(policy, monkeypatch):
    monkeypatch.setattr(LOCALISERS, "_entries", dict(LOCALISERS._entries))
    assert LOCALISERS.names() == ["random", "value", "prompt", "oracle", "self", "credit"]

    @LOCALISERS.register("last", "the last step")
    def last(parents, options):
        return [max(n - 1, 0) for n in parents.n_steps]

    task = ArithTask()
    probe = Probe(policy, task, SAMPLING, torch.Generator().manual_seed(0))
    r = sample_groups(policy, task, task.heldout_problems(2), 2, SAMPLING, torch.Generator().manual_seed(0))
    seg = probe.segment(r, "lines")
    picks = localise("last", r, [0, 3], probe, seg, random.Random(0))
    assert picks == [int(seg[i].max()) for i in (0, 3)]
    assert ResetConfig(localiser="last").localiser == "last"


def test_credo_methods_lists_strategies_and_localisers(capsys):
    assert main(["methods"]) == 0
    kinds = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.strip().splitlines()}
    assert {name: kinds.get(name) for name in STRATEGIES.names()} == {name: "strategy"
                                                                      for name in ("plain", "dynamic", "resets")}
    assert {name: kinds.get(name) for name in LOCALISERS.names()} == {name: "localiser" for name in
                                                                      ("random", "value", "prompt",
                                                                       "oracle", "self", "credit")}
    assert kinds["grpo"] == "estimator" and kinds["srpo"] == "recipe"


def test_random_streams_are_named_seed_offsets_and_round_trip():
    # fixed: runs depend on them
    assert SEED_OFFSETS == {"sample": 0, "problem": 1, "minibatch": 2, "probe": 3, "reset": 4}
    streams = RandomStreams.seeded(10)
    assert torch.equal(streams.problem.get_state(), torch.Generator().manual_seed(11).get_state())
    assert streams.reset.random() == random.Random(14).random()
    tensors, states = streams.state()
    assert set(tensors) == {"sample_generator", "problem_generator", "probe_generator"}
    assert set(states) == {"minibatch_rng", "reset_rng"}
    expected = (torch.rand(3, generator=streams.sample), streams.minibatch.random())
    again = RandomStreams.seeded(0)
    again.load(tensors, states)
    assert torch.equal(torch.rand(3, generator=again.sample), expected[0]) and again.minibatch.random() == expected[1]
