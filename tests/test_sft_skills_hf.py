"""The Hugging Face SFT mixture: solution-in-context and localisation examples for a chat model, in exactly the
formats SC-GRPO's teacher and SRPO's `prompt` localiser use at training time."""

import math
import random
from collections import Counter

import pytest
import torch

from credo.core.config import ConfigError, from_dict, to_dict
from credo.core.segment import SegmentInputs, segment, segment_bounds
from credo.credit.sc_grpo import teacher_prompt
from credo.policy.hf import HFPolicy
from credo.strategies.localisers import parse_step
from credo.tasks import make_task
from credo.tasks.gym_skills import corrupted_trace, localisation_example
from credo.train.sft_hf import HFSFTConfig, check_sft_inputs, example_kind, make_batch, mixture_example, sft_example

CHAIN = {"min_terms": 5, "max_terms": 8, "min_digits": 1, "max_digits": 1, "step_labels": True}


@pytest.fixture(scope="module")
def task():
    return make_task("gym:chain_sum", CHAIN)


@pytest.fixture(scope="module")
def problems(task):
    return task.train_problems(200, torch.Generator().manual_seed(5))


def test_corrupted_line_is_the_first_and_only_error_and_the_answer_follows_the_slip(task, problems):
    rng = random.Random(0)
    for problem in problems:
        n_ops = len(task.expression(problem).split()) // 2
        line = rng.randrange(n_ops + 1)
        completion = corrupted_trace(task, problem, line, rng)
        truth = task.step_truth(problem, completion)
        assert truth.first_error == line and truth.correct.count(False) == 1
        assert not task.is_correct(problem, completion)  # every slip changes the final answer
        assert task.step_truth(problem, sft_example(task, problem)).first_error is None


def test_localisation_example_is_the_localisers_request_about_the_segmenters_steps(task, problems, hf_dir):
    policy = HFPolicy.load(hf_dir)
    rng = random.Random(1)
    firsts = Counter()
    for problem in problems[:60]:
        state = rng.getstate()
        request, target = localisation_example(task, problem, rng)
        rng.setstate(state)  # the same draws again, to rebuild the trace the request is about
        n_ops = len(task.expression(problem).split()) // 2
        completion = corrupted_trace(task, problem, rng.randrange(n_ops + 1), rng)
        ids = torch.tensor([policy.encode_continuation(completion, eos=True)])
        segment_ids = segment(SegmentInputs([policy.token_strings(ids[0])], torch.ones_like(ids, dtype=torch.bool)),
                              "lines")
        steps = [policy.decode(ids[0, a:b]) for a, b in segment_bounds(segment_ids)[0]]  # as the trainer decodes
        assert request == task.localisation_prompt(problem, steps)
        first = task.step_truth(problem, completion).first_error
        assert parse_step(target, len(steps)) == (first, "boxed")
        firsts[first] += 1
    assert len(firsts) >= 6  # first errors spread over the lines, the answer line included


def test_reference_example_is_sc_grpos_teacher_context_with_the_system_prompt(task, problems):
    stub = type("P", (), {"model": None})()  # no context length: the teacher context is never cut
    problem = problems[0]
    prompt, system, target = mixture_example(task, problem, "reference", random.Random(0))
    assert target == sft_example(task, problem) and system
    assert prompt == teacher_prompt(task, stub, problem, target, 96, None, 0)
    assert mixture_example(task, problem, "plain", random.Random(0)) == (problem.prompt, True, target)


def test_batch_rows_encode_each_kind_as_the_trainer_renders_it(task, problems, hf_dir):
    policy = HFPolicy.load(hf_dir)
    policy.system_prompt = task.system_prompt
    kinds = ["plain", "reference", "localise"]
    rng = random.Random(2)
    prompt_ids, prompt_mask, target_ids, target_mask = make_batch(policy, task, problems[:3], kinds, rng)
    rng = random.Random(2)
    for row, kind in enumerate(kinds):
        prompt, system, target = mixture_example(task, problems[row], kind, rng)
        expected = policy.encode_prompts([prompt], system=system)[0][0].tolist()
        assert prompt_ids[row][prompt_mask[row]].tolist() == expected
        assert target_ids[row][target_mask[row]].tolist() == policy.encode_continuation(target, eos=True)
    bare = policy.prompt_row(problems[2].prompt, system=False)
    with_system = policy.prompt_row(problems[2].prompt, system=True)
    assert len(bare) < len(with_system)  # the localisation request really goes without the task's system prompt


def test_example_kinds_follow_the_shares_and_default_to_plain():
    config = HFSFTConfig(reference_frac=0.5, localisation_frac=0.2)
    rng = random.Random(0)
    counts = Counter(example_kind(rng.random(), config) for _ in range(20000))
    assert abs(counts["reference"] / 20000 - 0.5) < 0.015 and abs(counts["localise"] / 20000 - 0.2) < 0.015
    assert {example_kind(u / 100, HFSFTConfig()) for u in range(100)} == {"plain"}
    assert "reference_frac" not in to_dict(HFSFTConfig()) and "keep" not in to_dict(HFSFTConfig())


@pytest.mark.parametrize("values, field", [({"reference_frac": 0.8, "localisation_frac": 0.3}, "reference_frac"),
                                           ({"localisation_frac": -0.1}, "localisation_frac"),
                                           ({"keep": "first"}, "keep")])
def test_shares_and_keep_are_checked(values, field):
    with pytest.raises(ConfigError, match=field):
        from_dict(HFSFTConfig, values, prefix="sft.")


def test_localisation_needs_step_labels_named_in_one_line(hf_dir):
    plain = {k: v for k, v in CHAIN.items() if k != "step_labels"}
    with pytest.raises(ConfigError, match="sft.localisation_frac=0.2 needs a task with step labels"):
        check_sft_inputs(HFSFTConfig(start=hf_dir, task_options=plain, localisation_frac=0.2))
    check_sft_inputs(HFSFTConfig(start=hf_dir, task_options=CHAIN, localisation_frac=0.2))


@pytest.mark.parametrize("keep, saved_step", [("best", 0), ("last", 2)])
def test_keep_last_saves_the_final_weights_where_best_would_keep_the_start(hf_dir, tmp_path, monkeypatch, keep,
                                                                           saved_step):
    import credo.train.sft_hf as sft_hf
    falling = iter([0.5, 0.2, 0.1])  # validation accuracy falls as the skills are taught
    monkeypatch.setattr(sft_hf, "evaluate", lambda *a, **k: type("R", (), {"accuracy": next(falling)})())
    config = HFSFTConfig(start=hf_dir, task_options=CHAIN, steps=2, batch_size=2, lr=1e-2, warmup_steps=0,
                         eval_every=1, eval_n=2, max_new_tokens=4, target_accuracy=1.0, keep=keep,
                         reference_frac=0.5, localisation_frac=0.5 - 1e-9)
    summary = sft_hf.train_hf_sft(config, str(tmp_path / keep), progress=False)
    start, saved = HFPolicy.load(hf_dir).model.state_dict(), HFPolicy.load(str(tmp_path / keep)).model.state_dict()
    unchanged = all(torch.equal(start[k], saved[k]) for k in start)
    assert summary["step"] == saved_step and unchanged == (saved_step == 0)


def test_a_checks_reply_verdicts_every_step_up_to_the_first_error_and_names_it_last(task, problems):
    """Each step before the first wrong one is 'right', that one is 'wrong' with what it should say (the value
    the step before wrote, the problem's term, or the sum), and the localiser reads the step from the box."""
    rng = random.Random(3)
    reasons = Counter()
    for problem in problems[:120]:
        request, reply = localisation_example(task, problem, rng, reply="checks")
        lines = reply.splitlines()
        first, rule = parse_step(reply, len(lines))  # the box is the last line; each check line a step up to it
        assert rule == "boxed"
        assert lines[-1] == "\\boxed{" + str(first + 1) + "}" and len(lines) == first + 2
        assert all(line.startswith(f"Step {i + 1}: ") and line.endswith(": right") for i, line in enumerate(lines[:-2]))
        verdict = lines[-2].split(": wrong, ")
        assert len(verdict) == 2 and verdict[0].startswith(f"Step {first + 1}: ")
        step_text = request.split(f"\nStep {first + 1}: ")[1].split("\n")[0].strip()
        assert verdict[0] == f"Step {first + 1}: {step_text}"  # the step as the request shows it
        left, op, right = step_text.split()[:3] if "=" in step_text else ("", "", "")
        kinds = {"carry": verdict[1].startswith("the previous value is "),
                 "operand": verdict[1].startswith("the problem has "),
                 "answer": verdict[1].startswith("the last step gives "),
                 "result": verdict[1].startswith(f"{left} {op} {right} = ") and bool(left)}
        assert sum(kinds.values()) == 1, lines[-2]
        if kinds["result"]:  # the sum it should have written
            assert int(verdict[1].split(" = ")[1]) == int(left) + (1 if op == "+" else -1) * int(right)
        reasons.update(k for k, v in kinds.items() if v)
    # a carried slip names the previous value, a miscopied term the problem's, a wrong sum the sum, the answer line
    # the last step's value: each kind of slip occurs in 120 traces
    assert set(reasons) == {"carry", "operand", "answer", "result"} and sum(reasons.values()) == 120


def test_the_per_example_loss_weighs_a_short_reply_as_much_as_a_long_solution():
    from credo.train.sft_hf import sft_loss

    class Uniform:  # logits of a uniform LM over 4 tokens: every target token costs log 4
        def completion_logits(self, prompt_ids, prompt_mask, target_ids, target_mask):
            return torch.zeros(*target_ids.shape, 4)

    target = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    token, example = (float(sft_loss(Uniform(), None, None, target, mask, mean=m)) for m in ("token", "example"))
    assert token == pytest.approx(example)  # equal token costs: both log 4 ...
    costly = torch.zeros(2, 6, 4)
    costly[0, 0] = torch.tensor([-20.0, 0, 0, 0])  # ... the short row's one token now costs ~20 nats

    class Skewed(Uniform):
        def completion_logits(self, *args):
            return costly
    token, example = (float(sft_loss(Skewed(), None, None, target, mask, mean=m)) for m in ("token", "example"))
    short, log4 = 20 + math.log(3 + math.exp(-20)), math.log(4)  # the short row's token; every other one
    assert example == pytest.approx((short + log4) / 2, rel=1e-5)  # the short row counts half
    assert token == pytest.approx((short + 6 * log4) / 7, rel=1e-5)  # the short row counts 1/7


def test_the_reply_and_the_loss_mean_are_checked():
    with pytest.raises(ConfigError, match="sft.localisation_reply"):
        HFSFTConfig(localisation_reply="prose")
    with pytest.raises(ConfigError, match="sft.loss_mean"):
        HFSFTConfig(loss_mean="row")
    assert "localisation_reply" not in to_dict(HFSFTConfig())  # the default leaves a start's hash as it was
