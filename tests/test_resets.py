import random
import re

import pytest
import torch

from credo import credit
from credo.loss import LossConfig, policy_loss
from credo.policy.base import SamplingConfig, Samples
from credo.probe import Probe
from credo.resets import ResetConfig, collect_resets, localise, parse_step_index
from credo.tasks.arith import ArithTask
from credo.tasks.base import Problem
from credo.train import Trainer, load_train_config
from test_rredcot import batch


class Solver:
    """Wraps a tiny policy but always writes the correct solution (after any given prefix)."""

    def __init__(self, policy, task):
        self.inner, self.task = policy, task

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def sample(self, prompt_ids, prompt_mask, sampling, generator):
        texts = [self._solve(self.inner.decode(ids[m])) for ids, m in zip(prompt_ids, prompt_mask)]
        ids, mask = self.inner.encode_completions(texts)
        return Samples(ids, mask, torch.zeros(ids.shape))

    def _solve(self, text):
        expression, _, done = text.partition("\n")
        tokens = re.findall(r"\d+|[+\-]", expression)
        terms, ops = [int(t) for t in tokens[::2]], tokens[1::2]
        p = Problem(expression, expression + "\n", "", {"terms": terms, "ops": ops})
        full = self.task.solution(p)
        return full[len(done):] if full.startswith(done) else full


def draw(task, seed=0):
    g = torch.Generator().manual_seed(seed)
    return lambda n: task.train_problems(n, g)


def test_reset_groups_parent_excluded_prefix_masked(policy):
    task = ArithTask()
    probe = Probe(policy, task, SamplingConfig(max_new_tokens=24), torch.Generator().manual_seed(1))
    cfg = ResetConfig(n_fresh=3, n_reset=2, localiser="random")
    out = collect_resets(policy, task, draw(task), 2, cfg, SamplingConfig(max_new_tokens=24),
                         torch.Generator().manual_seed(0), probe, random.Random(0))
    r = out.rollouts
    assert r.batch_size == 2 * (3 + 2)
    assert sorted(set(r.group.tolist())) == [0, 1, 2, 3]  # Group 1 and Group 2 of each prompt apart
    rows = [row[m].tolist() for row, m in zip(r.completion_ids, r.completion_mask)]
    for p, parent in out.details["parents"].items():
        assert parent not in rows  # the parent is never trained on
        cut = out.details["reset_cuts"][p]
        for i in (r.group == 2 * p + 1).nonzero().flatten().tolist():
            assert rows[i][:cut] == parent[:cut]
            assert not r.loss_mask[i, :cut].any() and r.loss_mask[i, cut:len(rows[i])].all()
    for i in (r.group % 2 == 0).nonzero().flatten().tolist():
        assert r.loss_mask[i, :len(rows[i])].all()
    assert out.tokens_generated > int(r.completion_mask.sum()) - 1  # search samples are counted too


def test_groups_are_normalised_separately():
    from test_outcome import make_rollouts
    r = make_rollouts([1, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1], [3] * 6)
    adv = credit.get("grpo")(r, None, credit.get("grpo").make_config({"std": "population"})).advantages[:, 0]
    assert abs(float(adv[:3].sum())) < 1e-6 and abs(float(adv[3:].sum())) < 1e-6
    assert torch.allclose(adv[:3], torch.tensor([2 ** 0.5, -(0.5 ** 0.5), -(0.5 ** 0.5)]), atol=1e-5)


def test_fallback_when_no_failure_is_found(policy):
    task = ArithTask()
    solver = Solver(policy, task)
    probe = Probe(solver, task, SamplingConfig(max_new_tokens=40), torch.Generator().manual_seed(1))
    cfg = ResetConfig(n_fresh=2, n_reset=3, max_fresh_attempts=2)
    out = collect_resets(solver, task, draw(task), 2, cfg, SamplingConfig(max_new_tokens=40),
                         torch.Generator().manual_seed(0), probe, random.Random(0))
    r = out.rollouts
    assert out.info["reset_fallbacks"] == 2 and not out.details["parents"]
    assert sorted(set(r.group.tolist())) == [0, 2] and r.batch_size == 10 and bool(r.correct.all())


def test_oracle_localiser_is_exact_and_value_localiser_in_range(policy):
    task = ArithTask()
    r = batch(policy, task)
    probe = Probe(policy, task, SamplingConfig(max_new_tokens=8), torch.Generator().manual_seed(0))
    seg = probe.segment(r, "lines")
    rows = [1, 4, 5]  # first wrong line: the first, the second, the first
    assert localise("oracle", r, rows, probe, seg, random.Random(0)) == [0, 1, 0]
    for name in ("value", "random"):
        picks = localise(name, r, rows, probe, seg, random.Random(0))
        assert all(0 <= k < n for k, n in zip(picks, [2, 3, 1]))
    with pytest.raises(ValueError, match="localisation_prompt"):
        localise("prompt", r, rows, probe, seg, random.Random(0))


def test_prompt_localiser_parsing_of_messy_replies():
    assert parse_step_index("Step 3 looks wrong... no wait, it is step 2.", 5) == 1
    assert parse_step_index("I cannot tell", 5) == 2
    assert parse_step_index("the error is in step 99", 4) == 3
    assert parse_step_index("Step 0", 4) == 0
    assert parse_step_index("**Step 4**: 12+5=18", 6) == 5  # the last integer (18) wins, clamped


def test_pg_loss_has_no_ratio_or_clip():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-5.0, 0.0, 0.0]])  # far off-policy: a ratio would be clipped
    loss, _ = policy_loss(lp, old, torch.full((1, 3), 2.0), torch.tensor([[True, True, False]]), LossConfig(kind="pg"), 3)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1.0, -1.0, 0.0]]))


def test_rrpo_and_srpo_train_end_to_end(saved_policy, tmp_path):
    for method in ("rrpo", "srpo"):
        cfg = load_train_config(None, [f"method={method}", f"start={saved_policy}", "steps=1", "prompts_per_step=2",
                                       "reset.n_fresh=2", "reset.n_reset=2", "reset.max_fresh_attempts=2",
                                       "max_new_tokens=16", "eval_n=4", "final_eval_n=4"])
        assert cfg.loss.kind == "pg" and cfg.strategy == "resets"
        row = Trainer(cfg, str(tmp_path / method), progress=False).train_step()
        assert row["tokens_generated"] > 0
    cfg = load_train_config(None, ["method=srpo", "loss.kind=clip"])
    assert cfg.loss.kind == "clip" and cfg.reset.localiser == "value"
