"""The `shuffled:of=<method>` control: the wrapped method's segment credit, permuted within each trace."""

import json

import pytest
import torch

from builders import CHAIN, CHAIN_TEXTS, TRAIN_FAST, probe_for, rollouts_of
from credo import credit
from credo.train import methods
from credo.core.config import ConfigError, to_dict
from credo.core.segment import segment_means
from credo.tasks.arith import ArithTask
from credo.train.plan import load_train_config


def run(name_options, policy, texts=CHAIN_TEXTS):
    task = ArithTask()
    rollouts = rollouts_of(policy, task, texts, CHAIN)
    probe = probe_for(policy, task)
    name, options = credit.parse_spec(name_options)
    spec = credit.get(name)
    return rollouts, probe.segment(rollouts, "lines"), spec(rollouts, probe, spec.make_config(options))


@pytest.mark.parametrize("inner", ["rredcot:mode=replace", "rredcot", "ibpo", "sc_grpo"])
def test_same_multiset_of_segment_credit_per_trace_and_zero_on_padding(policy, inner):
    rollouts, segment_ids, original = run(inner, policy)
    name, options = credit.parse_spec(inner)
    _, _, control = run(f"shuffled:of={name}" + "".join(f":{k}={v}" for k, v in options.items()), policy)
    for field in ("advantages", "weights"):
        a, b = getattr(original, field), getattr(control, field)
        if a is None:
            assert b is None
            continue
        for before, after in zip(segment_means(a, segment_ids), segment_means(b, segment_ids)):
            assert torch.allclose(before.sort().values, after.sort().values, atol=1e-6)
    assert (control.advantages[~rollouts.completion_mask] == 0).all()
    assert control.cost == original.cost  # the wrapped method's cost, counted once


def test_weights_move_with_their_advantages(policy):
    _, segment_ids, original = run("sc_grpo", policy)
    _, _, control = run("shuffled:of=sc_grpo", policy)
    assert original.weights is not None
    for row in range(len(CHAIN_TEXTS)):
        def pairs(c):  # (advantage, weight) of each segment, ordered by weight
            table = torch.stack([segment_means(c.advantages, segment_ids)[row],
                                 segment_means(c.weights, segment_ids)[row]], 1)
            return table[table[:, 1].argsort()]
        assert torch.allclose(pairs(original), pairs(control), atol=1e-5)
    assert not torch.allclose(original.weights, control.weights)


def test_one_segment_trace_is_unchanged_and_credit_is_moved(policy):
    _, segment_ids, original = run("rredcot:mode=replace", policy)
    _, _, control = run("shuffled:of=rredcot:mode=replace", policy)
    assert torch.equal(control.advantages[3], original.advantages[3])  # '#### 25': one segment
    # credit is actually moved: some trace whose segments differ gets a different token layout
    varied = [r for r, m in enumerate(segment_means(original.advantages, segment_ids))
              if float(m.max() - m.min()) > 1e-3]
    assert varied and any(not torch.allclose(control.advantages[r], original.advantages[r]) for r in varied)


def test_seeded_and_deterministic(policy):
    first = run("shuffled:of=rredcot:mode=replace", policy)[2].advantages
    again = run("shuffled:of=rredcot:mode=replace", policy)[2].advantages
    other = [run(f"shuffled:of=rredcot:mode=replace:seed={s}", policy)[2].advantages for s in (1, 2, 3)]
    assert torch.equal(first, again)
    assert any(not torch.equal(first, o) for o in other)


def test_spec_parsing_in_train_and_errors_name_the_field():
    recipe = methods.resolve("shuffled:of=rredcot:lam=0.5")
    assert recipe.estimator == "shuffled" and recipe.defaults == {"credit": {"of": "rredcot", "lam": "0.5"}}
    config = load_train_config(None, ["method=shuffled:of=rredcot:lam=0.5"])
    made = credit.get("shuffled").make_config(config.credit)
    # the run records every option of the wrapped method, the one the spec set among them
    assert made.of == "rredcot" and made.options == to_dict(credit.get("rredcot").make_config({"lam": 0.5}))
    with pytest.raises(ConfigError, match=r"^credit\.options\.lam"):  # the path of the wrapped method's field
        credit.get("shuffled").make_config({"of": "rredcot", "lam": "-1"})
    with pytest.raises(ConfigError, match="credit.of"):
        credit.get("shuffled").make_config({"of": "nope"})


def test_trains_as_a_method(saved_policy, tmp_path):
    from credo.train.trainer import Trainer
    config = load_train_config(None, ["method=shuffled:of=rredcot", f"start={saved_policy}", "steps=1", *TRAIN_FAST])
    Trainer(config, str(tmp_path / "run"), progress=False).train()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    step = [r for r in rows if r.get("step") == 1 and "tokens_scored" in r]
    assert step and step[-1]["tokens_scored"] > 0  # the wrapped RREDCoT probe ran and its cost was counted


def test_the_audit_configures_a_control_like_the_method_it_shuffles():
    # the audit's vineppo row is its cheap K=4, unwhitened; its control must wrap exactly that, not K=9
    from credo.lab.audit.report import parse_method
    _, _, method = parse_method("vineppo")
    _, name, control = parse_method("shuffled:of=vineppo")
    made = credit.get(name).make_config(control)
    wrapped = credit.get("vineppo").make_config(made.options)
    assert (wrapped.k, wrapped.whiten) == (method["k"], method["whiten"]) == (4, False)
    _, _, given = parse_method("shuffled:of=vineppo:k=9")
    assert credit.get("vineppo").make_config(credit.get("shuffled").make_config(given).options).k == 9


@pytest.mark.parametrize("inner", ["sc_grpo", "rredcot"])
def test_token_level_keeps_each_traces_multiset_of_token_credit_and_zero_on_padding(policy, inner):
    rollouts, _, original = run(inner, policy)
    _, _, control = run(f"shuffled:of={inner}:level=token", policy)
    mask = rollouts.trainable_mask()
    for field in ("advantages", "weights"):
        a, b = getattr(original, field), getattr(control, field)
        if a is None:
            assert b is None
            continue
        for row in range(len(CHAIN_TEXTS)):
            assert torch.equal(a[row, mask[row]].sort().values, b[row, mask[row]].sort().values)
        assert (b[~mask] == (0 if field == "advantages" else a[~mask])).all()
    assert (control.advantages[~rollouts.completion_mask] == 0).all()
    moved = original.weights if original.weights is not None else original.advantages
    assert not torch.equal(moved, control.weights if original.weights is not None else control.advantages)


def test_token_level_is_independent_of_token_identity_where_the_segment_level_is_not(policy):
    """Credit that depends on the token alone (2 on every operator, 1 elsewhere, the same on every line):
    the token-level control spreads it evenly, the segment-level one keeps it on the operators."""
    from credo.credit.shuffled import permute_segments, permutations, shuffle_tokens
    from credo.core.rollouts import Credit
    from credo.core.segment import segment_bounds
    rollouts, segment_ids, _ = run("grpo", policy)
    mask = rollouts.trainable_mask()
    operator = torch.tensor([[policy.tokenizer.id_to_char.get(int(i)) in ("+", "-") for i in row]
                             for row in rollouts.completion_ids]) & mask
    weights = (1.0 + operator.float()) * mask
    on_ops_token, on_ops_segment, overall = [], [], float(weights[mask].mean())
    bounds = segment_bounds(segment_ids)
    for seed in range(200):
        credit = Credit(advantages=torch.ones_like(weights) * mask, weights=weights.clone())
        on_ops_token.append(float(shuffle_tokens(credit, rollouts, seed).weights[operator].mean()))
        segmented = permute_segments(weights, bounds, permutations(bounds, rollouts, seed), keep_sign=True)
        on_ops_segment.append(float(segmented[operator].mean()))
    assert abs(sum(on_ops_token) / 200 - overall) < 0.03
    assert sum(on_ops_segment) / 200 > overall + 0.3


def test_level_is_checked_and_the_segment_level_config_is_unchanged():
    with pytest.raises(ConfigError, match="credit.level"):
        credit.get("shuffled").make_config({"of": "grpo", "level": "tokens"})
    from credo.core.config import to_dict
    assert "level" not in to_dict(credit.get("shuffled").make_config({"of": "grpo"}))  # old run configs read the same
