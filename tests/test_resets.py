import random
import re

import pytest
import torch

from builders import padded_rollouts, two_group_batch
from credo import credit
from credo.core.loss import LossConfig, policy_loss
from credo.core.protocols import Problem, Samples, SamplingConfig
from credo.core.probe import Probe
from credo import strategies
from credo.strategies import SamplingContext
from credo.strategies.localisers import localise, parse_step, parse_step_index
from credo.strategies.resets import ResetConfig
from credo.tasks.arith import ArithTask
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer


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


def collect_resets(policy, task, draw, n_prompts, config, sampling, generator, probe, rng):
    """The registered `resets` strategy, as the trainer calls it."""
    ctx = SamplingContext(policy, task, draw, sampling, generator, probe, rng)
    return strategies.make("resets", config).collect(ctx, n_prompts)


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


class Scripted(Solver):
    """Fresh draws follow a per-prompt script (C = correct, W = wrong, E = empty); continuations of a
    reset prefix are solved correctly. Wrong draw k answers 9000 + k, so rows can be traced."""

    def __init__(self, policy, task, scripts):
        super().__init__(policy, task)
        self.scripts = {prompt: list(outcomes) for prompt, outcomes in scripts.items()}
        self.drawn = {prompt: 0 for prompt in scripts}

    def _solve(self, text):
        if not text.endswith("\n") or text.count("\n") > 1:
            return super()._solve(text)  # a reset continuation
        k = self.drawn[text]
        self.drawn[text] += 1
        outcome = self.scripts[text][k] if k < len(self.scripts[text]) else "C"
        return {"C": super()._solve(text), "W": f"1+1=2\n#### {9000 + k}", "E": ""}[outcome]


def test_parent_search_is_the_first_failure_among_all_fresh_draws(policy):
    task = ArithTask()
    problems = [Problem(e, e + "\n", str(eval(e)), {"terms": [int(x) for x in e.split("+")], "ops": ["+"]})
                for e in ("11+22", "33+44", "55+12", "21+13")]
    scripts = {"11+22\n": "CWWCCC", "33+44\n": "C" * 30, "55+12\n": "EWCCC", "21+13\n": "CCCCCCWC"}
    policy = Scripted(policy, task, scripts)
    probe = Probe(policy, task, SamplingConfig(max_new_tokens=24), torch.Generator().manual_seed(1))
    out = collect_resets(policy, task, lambda n: problems[:n], 4, ResetConfig(localiser="random"),
                         SamplingConfig(max_new_tokens=24), torch.Generator().manual_seed(0), probe, random.Random(0))
    r = out.rollouts
    texts = lambda g: [r.completions[i] for i in (r.group == g).nonzero().flatten().tolist()]  # noqa: E731
    solved = {p.prompt: task.solution(p) for p in problems}
    # 11+22: draw 2 (the first failure, inside what used to be Group 1) is the parent; draw 3 fills Group 1
    assert out.details["parents"][0] == policy.encode_completions(["1+1=2\n#### 9001"])[0][0].tolist()
    assert texts(0) == [solved["11+22\n"], "1+1=2\n#### 9002"] + [solved["11+22\n"]] * 2
    # 33+44: 12 correct draws in all, then the plain-group fallback of 8 (4 topped up outside the budget)
    assert 1 not in out.details["parents"] and texts(2) == [solved["33+44\n"]] * 8
    assert policy.drawn["33+44\n"] == 12 + 4
    # 55+12: an empty draw is never a parent; it stays in Group 1
    assert texts(4) == [""] + [solved["55+12\n"]] * 3
    # 21+13: Group 1 is full after 4 draws, correct draws 5 and 6 are dropped, draw 7 is the parent
    assert texts(6) == [solved["21+13\n"]] * 4
    assert out.info["fresh_draws_per_prompt"] == (5 + 12 + 5 + 7) / 4
    assert out.info["reset_fallbacks"] == 1.0 and sorted(out.details["parents"]) == [0, 2, 3]


def test_groups_are_normalised_separately():
    r = padded_rollouts([1, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1], [3] * 6)
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
    r = two_group_batch(policy, task)
    probe = Probe(policy, task, SamplingConfig(max_new_tokens=8), torch.Generator().manual_seed(0))
    seg = probe.segment(r, "lines")
    rows = [1, 4, 5]  # first wrong line: the first, the second, the first
    assert localise("oracle", r, rows, probe, seg, random.Random(0)) == [0, 1, 0]
    for name in ("value", "random"):
        picks = localise(name, r, rows, probe, seg, random.Random(0))
        assert all(0 <= k < n for k, n in zip(picks, [2, 3, 1]))
    with pytest.raises(ValueError, match="localisation_prompt"):
        localise("prompt", r, rows, probe, seg, random.Random(0))
    # SRPO's "self": the value localiser on a task with no localisation request (tiny arith)
    assert localise("self", r, rows, probe, seg, random.Random(0)) == localise("value", r, rows,
                                                                               probe, seg, random.Random(0))


def test_prompt_localiser_parser_reads_like_the_public_code():
    # 0-based results; the public parser is 1-based
    assert parse_step_index("the first error is in Step 2, where 85-12 = 63 should be 73", 5) == 1
    assert parse_step_index("", 5) == 0                                  # empty: step 1
    assert parse_step_index("Let me check 37+48=85, then 85-12=", 5) == 0  # truncated, no step named: step 1
    assert parse_step_index("The first wrong step is \\boxed{", 5) == 0  # truncated inside the box: step 1
    assert parse_step_index("I cannot tell where it goes wrong.", 5) == 0  # number-free: step 1
    assert parse_step_index("Step 4 shows the wrong total, but it originates earlier.\n\\boxed{2}", 5) == 1
    assert parse_step_index("\\boxed{3} no wait \\boxed{ 4 }", 5) == 3    # the last box wins
    assert parse_step_index("\\boxed{0}", 5) == 0                        # "no error": step 1
    assert parse_step_index("\\boxed{99}, i.e. Step 3", 5) == 2          # box out of range: the prose decides
    assert parse_step_index("\\boxed{85}", 5) == 0                       # the problem's answer, not a step: step 1
    assert parse_step_index("Step 3 looks wrong... no wait, it is step 2.", 5) == 1
    assert parse_step_index("the error is in step 99", 4) == 0           # out of range: step 1
    assert parse_step_index("**Step 4**: 12+5=18", 6) == 3               # a number that is not a step is ignored
    assert [parse_step(r, 5)[1] for r in ("\\boxed{2}", "it is Step 2", "", "\\boxed{7}")] == ["boxed",
                                                                                               "prose", "fallback",
                                                                                               "fallback"]


def test_pg_loss_has_no_ratio_or_clip():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-5.0, 0.0, 0.0]])  # far off-policy: a ratio would be clipped
    loss, _ = policy_loss(lp, old, torch.full((1, 3), 2.0), torch.tensor([[True, True, False]]),
                          LossConfig(kind="pg"), 3)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1.0, -1.0, 0.0]]))


def test_rrpo_and_srpo_train_end_to_end(saved_policy, tmp_path):
    for method in ("rrpo", "srpo"):
        cfg = load_train_config(None, [f"method={method}", f"start={saved_policy}", "steps=1", "prompts_per_step=2",
                                       "reset.n_fresh=2", "reset.n_reset=2", "reset.max_fresh_attempts=2",
                                       "sampling.max_new_tokens=16", "eval_n=4", "final_eval_n=4"])
        assert cfg.loss.kind == "pg" and cfg.strategy == "resets"
        row = Trainer(cfg, str(tmp_path / method), progress=False).train_step()
        assert row["tokens_generated"] > 0
    cfg = load_train_config(None, ["method=srpo", "loss.kind=clip"])
    assert cfg.loss.kind == "clip" and cfg.reset.localiser == "self"


def test_reset_collection_repeats_with_the_seed(policy):
    task = ArithTask()
    cfg = ResetConfig(n_fresh=2, n_reset=2, localiser="random")

    def collect():
        probe = Probe(policy, task, SamplingConfig(max_new_tokens=16), torch.Generator().manual_seed(1))
        return collect_resets(policy, task, draw(task), 3, cfg, SamplingConfig(max_new_tokens=16),
                              torch.Generator().manual_seed(0), probe, random.Random(0))

    a, b = collect(), collect()
    assert (torch.equal(a.rollouts.completion_ids, b.rollouts.completion_ids)
            and a.tokens_generated == b.tokens_generated)
    assert torch.equal(a.rollouts.loss_mask, b.rollouts.loss_mask) and a.details == b.details
