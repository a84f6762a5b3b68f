import json
import os

import pytest
import torch

from builders import TRAIN_FAST, dapo_config, strip_time
from credo.cli.main import main
from credo.policy import load_policy
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer


def test_resume_after_kill_matches_uninterrupted_run(saved_policy, tmp_path):
    full = Trainer(dapo_config(saved_policy), str(tmp_path / "full"), progress=False)
    summary_full = full.train()
    killed = Trainer(dapo_config(saved_policy), str(tmp_path / "killed"), progress=False)
    killed.train(stop_after=3)  # dies after step 3: its last checkpoint is step 2
    resumed = Trainer(dapo_config(saved_policy), str(tmp_path / "killed"), progress=False)
    summary_resumed = resumed.train()
    assert strip_time(full.log.rows()) == strip_time(resumed.log.rows())
    assert summary_full["final_accuracy"] == summary_resumed["final_accuracy"]
    a = load_policy(str(tmp_path / "full" / "final")).model.state_dict()
    b = load_policy(str(tmp_path / "killed" / "final")).model.state_dict()
    start = load_policy(saved_policy).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], start[k]) for k in a), "training never changed the weights"


def test_same_seed_same_run_and_run_directory_contents(saved_policy, tmp_path):
    rows = []
    for name in ("a", "b"):
        t = Trainer(dapo_config(saved_policy, "steps=2", "method=grpo"), str(tmp_path / name), progress=False)
        t.train()
        rows.append(strip_time(t.log.rows()))
    assert rows[0] == rows[1]
    run = tmp_path / "a"
    assert {"config.yaml", "metrics.jsonl", "checkpoints", "final", "summary.json"} <= set(os.listdir(run))
    assert not [f for f in os.listdir(run) if f.startswith(".tmp")]


def test_dynamic_sampling_counts_discarded_tokens(saved_policy, tmp_path):
    t = Trainer(dapo_config(saved_policy, "steps=1", "overlong_buffer=0"), str(tmp_path / "d"), progress=False)
    row = t.train_step()
    # an untrained model gets every reward 0: each round is discarded, so all rounds' tokens are counted
    assert row["sampling_rounds"] == 4.0
    assert row["tokens_generated"] > 3 * 4 * 4  # more than one round of 12 completions x >= 1 token


def test_cli_train_eval_methods(saved_policy, tmp_path, capsys):
    assert main(["methods"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.strip().splitlines()]
    assert {"grpo", "dr_grpo", "rloo", "dapo", "gspo"} <= set(names)
    out = str(tmp_path / "run")
    args = ["train", "--method", "gspo", "--out", out, "--start", saved_policy, "--steps", "2", "--quiet"]
    assert main(args + sum((["--set", s] for s in TRAIN_FAST), [])) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", out, "--n", "5", "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("accuracy=") and 0.0 <= float(last.split("=")[1]) <= 1.0
    assert main(args) == 2  # refuses to overwrite an existing run
    assert main(["train", "--out", str(tmp_path / "x"), "--set", "loss.eps_hi=1"]) == 2
    assert "loss.eps_hi" in capsys.readouterr().err


def test_one_epoch_of_one_minibatch_reads_its_own_logprobs_as_old_and_skips_the_rescoring(saved_policy, tmp_path,
                                                                                          monkeypatch):
    """On-policy schedule: one forward per step (the update's), ratio exactly 1 (no clipping), and the same
    update as re-scoring the old log-probabilities separately (up to float noise)."""
    on_policy = dapo_config(saved_policy, "epochs=1", "minibatches=1", "steps=2")
    calls = []
    fast = Trainer(on_policy, str(tmp_path / "fast"), progress=False)
    original = fast.policy.score
    fast.policy.score = lambda *a, **k: calls.append(torch.is_grad_enabled()) or original(*a, **k)
    fast.train_step()
    assert calls == [True]  # the update's forward only
    fast.train_step()
    fast.train_step()
    monkeypatch.setattr(Trainer, "on_policy", property(lambda self: False))
    slow = Trainer(on_policy, str(tmp_path / "slow"), progress=False)
    for _ in range(3):
        slow.train_step()
    a, b = fast.policy.model.state_dict(), slow.policy.model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert any(not torch.equal(a[k], load_policy(saved_policy).model.state_dict()[k]) for k in a)


def test_dapo_fits_its_overlong_buffer_beyond_every_worked_solution_of_the_task(saved_policy):
    """DAPO's buffer sits past the expected length: on arith the worked solutions are short and the full buffer
    stays; squeezed by a max_new_tokens near the longest solution, the buffer shrinks so that none is penalised."""
    import torch
    from credo.tasks import make_task
    from credo.train.shaping import overlong_buffer_for_task, overlong_penalty
    task = make_task("arith", {})
    def encode(texts):  # one token a character, plus EOS, as the tiny policy encodes
        return torch.nn.utils.rnn.pad_sequence([torch.ones(len(t) + 1) for t in texts], batch_first=True)
    problems = task.train_problems(256, torch.Generator().manual_seed(0))
    longest = max(len(task.solution(p)) + 1 for p in problems)
    assert overlong_buffer_for_task(task, encode, longest + 40, 16) == (16, longest)
    buffer, _ = overlong_buffer_for_task(task, encode, longest + 5, 16)
    assert buffer == 5
    lengths = torch.tensor([len(task.solution(p)) + 1 for p in problems])
    assert overlong_penalty(lengths, longest + 5, buffer, 1.0).eq(0).all()  # no worked solution penalised
    assert overlong_penalty(lengths, longest + 5, 16, 1.0).lt(0).any()  # the unfitted buffer penalised some
    assert overlong_buffer_for_task(task, encode, longest - 3, 16)[0] == 0  # no room at all: the penalty is off


def test_dapo_fits_its_overlong_buffer_to_a_gym_tasks_worked_solutions_and_refuses_a_task_without(tmp_path):
    """On a `gym:` task the worked solution is its reference completion (the running sums and the answer line):
    the longest of them bounds the buffer as on arith. A task with no worked solution cannot be fitted: one line
    naming train.overlong_fit_task."""
    import pytest
    import torch
    from builders import CHAIN_SUM_OPTIONS
    from credo.core.config import ConfigError
    from credo.tasks import make_task
    from credo.train.shaping import overlong_buffer_for_task
    def encode(texts):  # one token a character, plus EOS
        return torch.nn.utils.rnn.pad_sequence([torch.ones(len(t) + 1) for t in texts], batch_first=True)
    task = make_task("gym:chain_sum", CHAIN_SUM_OPTIONS)
    problems = task.train_problems(256, torch.Generator().manual_seed(0))
    solutions = ["".join(task.reference_solution(p)) for p in problems]
    assert all(text.endswith(f"\n<answer>{p.answer}</answer>") and " = " in text.split("\n")[0]
               for p, text in zip(problems, solutions))  # the running sums, then the answer line
    longest = max(len(text) + 1 for text in solutions)
    assert overlong_buffer_for_task(task, encode, longest + 40, 16) == (16, longest)
    assert overlong_buffer_for_task(task, encode, longest + 5, 16) == (5, longest)
    data = tmp_path / "bare.jsonl"
    data.write_text("".join(f'{{"question": "{i}+1?", "answer": "{i + 1}"}}\n' for i in range(40)))
    with pytest.raises(ConfigError, match=r"^train\.overlong_fit_task .* has none"):
        overlong_buffer_for_task(make_task(f"jsonl:{data}"), encode, 64, 16)


def test_a_dapo_run_records_the_buffer_it_fitted_and_the_longest_worked_solution(saved_policy, tmp_path):
    fitted = Trainer(dapo_config(saved_policy, "steps=1", "overlong_fit_task=true", "sampling.max_new_tokens=64"),
                     str(tmp_path / "fit"), progress=False)
    summary = fitted.train()
    longest = summary["longest_worked_solution"]
    assert summary["overlong_buffer_used"] == max(0, min(12, 64 - longest)) and 20 < longest <= 64
    plain = Trainer(dapo_config(saved_policy, "steps=1"), str(tmp_path / "plain"), progress=False).train()
    assert "overlong_buffer_used" not in plain


def test_a_run_on_the_validation_split_evaluates_there_and_never_trains_on_it(saved_policy, tmp_path):
    from credo.core.config import ConfigError, dump_yaml
    from credo.tasks import make_task
    task = make_task("arith")
    validation = task.validation_problems(300)
    keys = {p.key for p in validation}
    assert len(keys) == 300 and not any(task.is_heldout(p) for p in validation)
    assert [p.key for p in task.validation_problems(300)] == [p.key for p in validation]  # a fixed sequence
    assert not keys & {p.key for p in task.heldout_problems(500)}
    config = load_train_config(None, ["method=grpo", f"start={saved_policy}", "eval_split=validation",
                                      *TRAIN_FAST])
    trainer = Trainer(config, str(tmp_path / "run"), progress=False)
    assert trainer.task.train_exclude == {p.key for p in validation[:8]}  # max(eval_n, final_eval_n) = 8
    drawn = {p.key for p in trainer.task.train_problems(5000, torch.Generator().manual_seed(0))}
    assert not drawn & trainer.task.train_exclude
    trainer.evaluate(8)
    assert trainer.eval_size == 8
    assert "eval_split: validation" in dump_yaml(config)
    assert "eval_split" not in dump_yaml(load_train_config(None, [f"start={saved_policy}"]))  # old records unchanged
    with pytest.raises(ConfigError, match=r"^train\.eval_split=validation needs a task with a validation split"):
        jsonl = os.path.join(os.path.dirname(__file__), "data", "jsonl", "long_arith.jsonl")
        Trainer(load_train_config(None, [f"task=jsonl:{jsonl}", "eval_split=validation", f"start={saved_policy}"]),
                str(tmp_path / "jsonl"), progress=False)


def test_fused_adamw_is_opt_in_and_moves_the_weights_as_the_default_loop_does(saved_policy, tmp_path):
    weights = {}
    for fused in (False, True):
        t = Trainer(dapo_config(saved_policy, "steps=1", "method=grpo", f"fused_adamw={str(fused).lower()}"),
                    str(tmp_path / str(fused)), progress=False)
        assert bool(t.optimizer.defaults["fused"]) is fused
        t.train()
        weights[fused] = load_policy(str(tmp_path / str(fused) / "final")).model.state_dict()
    start = load_policy(saved_policy).model.state_dict()
    assert any(not torch.equal(weights[True][k], start[k]) for k in start), "no step moved the weights"
    # the same update up to rounding (the fused kernel orders its float operations differently)
    assert all(torch.allclose(weights[True][k], weights[False][k], atol=1e-6, rtol=0) for k in start)


def test_each_step_records_the_size_of_its_update_after_adam(saved_policy, tmp_path):
    """update_norm is ||weights after - weights before|| of the step's one AdamW update (epochs=1,
    minibatches=1), what the gradient-norm clip does not show."""
    config = dapo_config(saved_policy, "steps=1", "epochs=1", "minibatches=1")  # its overlong penalty varies rewards
    trainer = Trainer(config, str(tmp_path / "run"), progress=False)
    before = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    trainer.train()
    row = next(r for r in trainer.log.rows() if "update_norm" in r)
    after = trainer.policy.model.state_dict()
    moved = float(sum(((after[k] - before[k]).double() ** 2).sum() for k in before) ** 0.5)
    assert moved > 0 and abs(row["update_norm"] - moved) <= 1e-6 * moved


def test_a_mini_batch_without_signal_skips_its_forward_and_backward_and_changes_nothing(saved_policy, tmp_path,
                                                                                          monkeypatch):
    """Steps 3 and 4 given all-zero credit: the update takes their zero gradients without a forward or a
    backward, and AdamW still steps (its momentum moves the weights), exactly as the backward would."""
    from dataclasses import replace
    from credo.train.step import TrainerStep
    assign, decide = TrainerStep.assign_credit, TrainerStep.without_signal

    def zero_on_steps_3_and_4(self, rollouts):
        credit = assign(self, rollouts)
        return replace(credit, advantages=torch.zeros_like(credit.advantages)) if self.step in (2, 3) else credit

    decisions = []

    def recorded(self, *args):
        decisions.append(decide(self, *args))
        return decisions[-1]

    monkeypatch.setattr(TrainerStep, "assign_credit", zero_on_steps_3_and_4)
    runs = {}
    for name, skip in (("skipping", recorded), ("computing", lambda self, *args: False)):
        monkeypatch.setattr(TrainerStep, "without_signal", skip)
        config = load_train_config(None, ["method=grpo", f"start={saved_policy}", "steps=5", "epochs=1",
                                          "minibatches=1", *TRAIN_FAST])
        trainer = Trainer(config, str(tmp_path / name), progress=False)
        trainer.train()
        runs[name] = (strip_time(trainer.log.rows()), load_policy(str(tmp_path / name / "final")).model.state_dict())
    assert decisions == [False, False, True, True, False]  # step 1's backward shows which weights the loss reaches
    rows, weights = runs["skipping"]
    assert json.dumps(rows) == json.dumps(runs["computing"][0])  # -0.0 would show here
    assert all(torch.equal(weights[k], runs["computing"][1][k]) for k in weights)
    update_rows = [r for r in rows if "grad_norm" in r]
    assert [r["grad_norm"] == 0 for r in update_rows] == [False, False, True, True, False]
    assert all(r["update_norm"] > 0 for r in update_rows)  # AdamW stepped on the steps without signal too
    monkeypatch.setattr(TrainerStep, "without_signal", recorded)
    for where, settings in (("two-epochs", ["epochs=2"]), ("kl", ["epochs=1", "minibatches=1", "loss.kl_coef=0.1"])):
        decisions.clear()  # off-policy ratios (clipping) or a KL term: the gradient is not zero, nothing is skipped
        Trainer(load_train_config(None, ["method=grpo", f"start={saved_policy}", "steps=4", *TRAIN_FAST, *settings]),
                str(tmp_path / where), progress=False).train()
        assert decisions and not any(decisions)


def test_a_model_that_draws_dropout_is_seen_by_its_modules_or_its_config():
    from types import SimpleNamespace
    from credo.train.step import draws_dropout
    assert not draws_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))
    assert draws_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))
    quiet, noisy = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    quiet.config = SimpleNamespace(attention_dropout=0.0, resid_pdrop=0, classifier_dropout=None, use_cache=True)
    noisy.config = SimpleNamespace(attention_dropout=0.0, resid_pdrop=0.1)
    assert not draws_dropout(quiet) and draws_dropout(noisy)
