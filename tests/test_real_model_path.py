"""The real-model path on this machine: machine-sized defaults for Hugging Face starts, the format/answer
SFT (`credo sft --start ...`), worked solutions for reasoning-gym chain sums, and the ETA shown before the
first step (which must not change the run)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from credo.cli.main import main
from credo.policy.hf import HFPolicy
from credo.train.sft_hf import HFSFTConfig, make_batch, sft_loss, train_hf_sft
from credo.tasks import make_task
from credo.tasks.gym import running_sum_solution
from credo.train.config import CPU_HF_DEFAULTS, HF_DEFAULTS, is_hf_start
from credo.train.plan import load_train_config
from credo.train.eta import estimate_run_seconds, evaluations_left, format_seconds, steps_within, time_step_pieces

CHAIN = {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}


def test_running_sum_solution_writes_one_line_per_operation():
    assert running_sum_solution("4 - 1 - 7") == "4 - 1 = 3\n3 - 7 = -4"
    assert running_sum_solution("2 - -1") == "2 - -1 = 3"
    for not_a_chain in ("5 * 3", "(1 + 2) - 3", "1.5 + 2", "7", None, "1 +"):
        assert running_sum_solution(not_a_chain) is None


def test_gym_chain_sum_worked_solution_ends_at_the_verified_answer():
    task = make_task("gym:chain_sum", CHAIN)
    for problem in task.heldout_problems(20):
        solution = task.worked_solution(problem)
        marker, answer = task.answer_probe(problem.answer)
        assert solution.splitlines()[-1].endswith(f"= {problem.answer}")
        assert task.reward(problem, solution + marker + answer) == 1.0


def test_is_hf_start_tells_models_apart_without_loading(hf_dir, tmp_path):
    from credo.train.sft import ensure_sft
    assert is_hf_start("smollm2-135m") and is_hf_start(hf_dir)
    assert not is_hf_start("") and not is_hf_start(ensure_sft(progress=False))  # the tiny GPT's start
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")  # a bare HF directory (no credo policy.json)
    assert is_hf_start(str(plain))


def test_hf_start_on_cpu_gets_machine_sized_defaults_that_settings_override(hf_dir):
    sized = load_train_config(extra={"start": hf_dir})
    assert (sized.prompts_per_step, sized.group_size, sized.sampling.max_new_tokens) == (
        CPU_HF_DEFAULTS["prompts_per_step"], CPU_HF_DEFAULTS["group_size"],
        CPU_HF_DEFAULTS["sampling"]["max_new_tokens"])
    assert (sized.eval_n, sized.final_eval_n) == (CPU_HF_DEFAULTS["eval_n"], CPU_HF_DEFAULTS["final_eval_n"])
    mine = load_train_config(overrides=["eval_n=7", "sampling.max_new_tokens=20"], extra={"start": hf_dir})
    assert (mine.eval_n, mine.sampling.max_new_tokens, mine.group_size) == (7, 20, CPU_HF_DEFAULTS["group_size"])
    assert (sized.lr == HF_DEFAULTS["lr"]
            and load_train_config(overrides=["lr=1e-4"], extra={"start": hf_dir}).lr == 1e-4)
    tiny = load_train_config()
    assert (tiny.prompts_per_step, tiny.eval_n, tiny.lr) == (8, 200, 2e-5)  # the tiny GPT keeps the field defaults


def test_sft_loss_is_the_mean_negative_log_likelihood_of_the_target_tokens(hf_dir):
    task = make_task("gym:chain_sum", CHAIN)
    policy = HFPolicy.load(hf_dir)
    policy.system_prompt = task.system_prompt
    problems = task.heldout_problems(3)
    prompt_ids, prompt_mask, target_ids, target_mask = make_batch(policy, task, problems)
    assert all(int(target_ids[i, int(target_mask[i].sum()) - 1]) == policy.eos_id for i in range(3))  # ends the turn
    logprobs, _ = policy.score(prompt_ids, prompt_mask, target_ids, target_mask)
    expected = -logprobs.sum() / target_mask.sum()
    assert torch.allclose(sft_loss(policy, prompt_ids, prompt_mask, target_ids, target_mask), expected, atol=1e-5)


def test_hf_sft_lowers_the_loss_and_saves_a_start_train_can_load(hf_dir, tmp_path):
    config = HFSFTConfig(start=hf_dir, task_options=CHAIN, steps=6, batch_size=4, lr=3e-3, warmup_steps=0,
                         eval_every=3, eval_n=4, max_new_tokens=8, target_accuracy=1.0)
    task = make_task("gym:chain_sum", CHAIN)
    batch_problems = task.heldout_problems(4)

    def loss_of(path: str) -> float:
        policy = HFPolicy.load(path)
        with torch.no_grad():
            return float(sft_loss(policy, *make_batch(policy, task, batch_problems)))

    out = str(tmp_path / "sft")
    summary = train_hf_sft(config, out, progress=False)
    assert loss_of(out) < loss_of(hf_dir) - 0.5
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 3, 6] and summary["val_n"] == 4
    assert HFPolicy.load(out).system_prompt == task.system_prompt  # the format the start was taught travels with it
    assert load_train_config(extra={"start": out}).group_size == CPU_HF_DEFAULTS["group_size"]


def test_sft_cli_with_start_trains_then_refuses_to_redo_without_retrain(hf_dir, tmp_path, capsys):
    out = str(tmp_path / "start")
    argv = ["sft", "--start", hf_dir, "--task", "gym:chain_sum", "--out", out, "--quiet", "--eval-n", "4",
            "--set", "steps=1", "--set", "eval_every=1", "--set", "eval_n=2", "--set", "max_new_tokens=4",
            "--set", "task_options.min_terms=2", "--set", "task_options.max_terms=2"]
    assert main(argv) == 0
    assert "heldout_accuracy=" in capsys.readouterr().out
    assert main(argv) == 2
    assert "already holds an SFT start; pass --retrain" in capsys.readouterr().err
    assert main(["sft", "--start", hf_dir, "--task", "gym:chain_sum", "--out", str(tmp_path / "x"),
                 "--set", "steps=0"]) == 2
    assert "sft.steps must be > 0" in capsys.readouterr().err


def test_a_task_without_worked_solutions_is_one_line_naming_it(hf_dir, tmp_path, capsys):
    assert main(["sft", "--start", hf_dir, "--task", "gym:leg_counting", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "has no worked solution" in capsys.readouterr().err


def test_eta_pieces_leave_weights_gradients_and_random_state_untouched(hf_dir):
    policy = HFPolicy.load(hf_dir)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    params = list(policy.model.parameters())
    params[0].grad = torch.ones_like(params[0])  # a gradient already there must come back unchanged
    rng = torch.get_rng_state()
    generation, update = time_step_pieces(policy, "3 + 4 =", rows=4, max_new_tokens=8, update_rows=2)
    assert generation > 0 and update > 0
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())
    assert torch.equal(params[0].grad, torch.ones_like(params[0])) and all(p.grad is None for p in params[1:])
    assert torch.equal(torch.get_rng_state(), rng)


def test_eta_arithmetic():
    # step = generation + 2 updates x 3 s x 4/3 (re-scoring) = 2 + 8 = 10; 10 steps + 4 evals x 5 s + final 2 x 5 s
    assert estimate_run_seconds((2.0, 3.0), updates_per_step=2, steps_left=10, evaluations=4, eval_seconds=5.0,
                                final_eval_scale=2.0) == 100 + 20 + 10
    assert estimate_run_seconds((2.0, 3.0), 2, 10, 0, 5.0, 0.0, rescore=False) == 80  # on-policy: no re-scoring
    assert steps_within(1_000_000, tokens_left=1000, tokens_per_step=64, budgeted=True) == 16
    assert steps_within(5, tokens_left=1000, tokens_per_step=64, budgeted=True) == 5
    assert steps_within(7, tokens_left=0, tokens_per_step=64, budgeted=False) == 7
    assert (evaluations_left(step=0, steps=10, eval_every=5) == 2
            and evaluations_left(step=5, steps=12, eval_every=5) == 1)
    assert [format_seconds(s) for s in (45, 200, 3900)] == ["45s", "3m20s", "1h05m"]


@pytest.mark.slow
def test_a_run_with_the_eta_bar_is_the_same_run_as_one_without(tmp_path):
    from credo.train.trainer import Trainer
    config = load_train_config(overrides=["steps=2", "prompts_per_step=2", "group_size=2", "eval_n=4",
                                          "final_eval_n=4", "eval_every=1"])
    runs = []
    for progress in (False, True):
        run = str(tmp_path / f"run-{progress}")
        Trainer(config, run, progress=progress).train()
        rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
        runs.append(([{k: v for k, v in r.items() if k != "seconds"} for r in rows],
                     load_file(os.path.join(run, "final", "model.safetensors"))))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1].keys() == runs[1][1].keys() and all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def test_a_given_max_new_tokens_replaces_the_machine_sized_one(hf_dir):
    config = load_train_config(overrides=["sampling.max_new_tokens=32"], extra={"start": hf_dir})
    assert config.sampling.max_new_tokens == 32
    with pytest.raises(Exception, match=r"^train.sampling.max_new_tokens must be > 0"):
        load_train_config(overrides=["sampling.max_new_tokens=0"], extra={"start": hf_dir})


def test_sft_checks_its_inputs_before_touching_out_and_retries_after_a_failure(hf_dir, tmp_path, capsys):
    out = tmp_path / "start"
    assert main(["sft", "--task", "gym:no_such_dataset", "--start", hf_dir, "--out", str(out), "--quiet"]) == 2
    assert "no_such_dataset" in capsys.readouterr().err and not out.exists()
    assert main(["sft", "--task", "gym:chain_sum", "--start", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "nowhere" in capsys.readouterr().err and not out.exists()
    out.mkdir()
    (out / ".credo-kind").write_text("sft\n")  # a run that was interrupted before it saved anything
    argv = ["sft", "--start", hf_dir, "--task", "gym:chain_sum", "--out", str(out), "--quiet", "--eval-n", "2",
            "--set", "steps=1", "--set", "eval_n=2", "--set", "max_new_tokens=4"]
    assert main(argv) == 0  # not "already holds an SFT start": it never finished


def test_a_comparison_from_a_hf_start_records_the_schedule_its_runs_train_with(hf_dir):
    from credo.lab.compare.presets import PRESETS, protocol
    recorded = protocol(PRESETS["smoke"], hf_dir, jobs=1)
    assert recorded["schedule"]["lr"] == HF_DEFAULTS["lr"] and recorded["schedule"]["minibatches"] == 1
    assert all(m["source"] == "shared" for m in recorded["methods"].values())


def test_resets_rows_are_rescored_on_an_on_policy_schedule():
    """The resets strategy's reset rows carry placeholder old log-probs: prepare re-scores them even when
    the update reads its own (SPO's cutpoints read old_logprobs)."""
    import tempfile
    from credo.train.trainer import Trainer
    config = load_train_config(overrides=["method=rrpo", "epochs=1", "minibatches=1", "prompts_per_step=2",
                                          "eval_n=4", "final_eval_n=0"])
    trainer = Trainer(config, tempfile.mkdtemp(), progress=False)
    calls = []
    original = trainer.policy.score
    trainer.policy.score = lambda *a, **k: calls.append(torch.is_grad_enabled()) or original(*a, **k)
    trainer.train_step()
    assert False in calls  # the no-grad re-scoring ran


def test_a_token_budgeted_run_counts_its_bar_in_generated_tokens(tmp_path, capsys):
    # steps=1000 never binds: a bar over steps would show ".../1000" and an ETA for 1000 steps
    from credo.train.trainer import Trainer
    config = load_train_config(overrides=["steps=1000", "max_generated_tokens=150", "prompts_per_step=2",
                                          "group_size=2", "eval_n=2", "final_eval_n=2", "eval_every=1000"])
    Trainer(config, str(tmp_path / "run"), progress=True).train()
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "150/150" in bar and "tok/s" in bar and "/1000" not in bar, bar
    steps = load_train_config(overrides=["steps=2", "prompts_per_step=2", "group_size=2", "eval_n=2",
                                         "final_eval_n=2", "max_generated_tokens=100000"])
    Trainer(steps, str(tmp_path / "run2"), progress=True).train()
    assert "2/2" in capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
