"""CreditGRPOTrainer: TRL's GRPOTrainer with credo advantages, on a tiny local Llama (no hub)."""

import pytest
import torch

import datasets  # noqa: E402  (trl and datasets are pinned dependencies: a missing one must fail, not skip)

from credo.integrations.trl import CreditGRPOTrainer  # noqa: E402
from credo.tasks import make_task  # noqa: E402
from builders import build_tokenizer, tiny_llama  # noqa: E402


def tiny_model(tokenizer):
    return tiny_llama(tokenizer, max_positions=256)


def reward_len(completions, **kwargs):
    # a reward that varies on a random model: shorter completions score higher
    return [1.0 if len(c) < 12 else 0.0 for c in completions]


def make_trainer(tmp_path, credit, **extra):
    from trl import GRPOConfig
    tokenizer = build_tokenizer()
    task = make_task("gym:chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in task.heldout_problems(8)]
    args = GRPOConfig(output_dir=str(tmp_path / credit), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=2, logging_steps=1, report_to=[], use_cpu=True,
                      bf16=False, seed=0, save_strategy="no", learning_rate=1e-3)
    return CreditGRPOTrainer(model=tiny_model(tokenizer), processing_class=tokenizer, reward_funcs=reward_len,
                             args=args, train_dataset=datasets.Dataset.from_list(rows),
                             credit=credit, task=task, **extra)


@pytest.mark.parametrize("credit", ["grpo", "rredcot", "lambda_grpo", "entropy_mask", "otb", "prefix_shaping"])
def test_two_training_steps(tmp_path, credit):
    trainer = make_trainer(tmp_path, credit)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    if credit == "rredcot":
        assert trainer.credit_cost_total["tokens_scored"] > 0


def test_a_peft_config_reaches_trl_and_credit_probes_the_adapted_model(tmp_path, monkeypatch):
    from peft import LoraConfig, PeftModel
    from credo.core.probe import Probe
    trainer = make_trainer(tmp_path, "rredcot", peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                         task_type="CAUSAL_LM"))
    assert isinstance(trainer.model, PeftModel)  # TRL wrapped the model with the adapter asked for
    probed = []  # the model behind each Probe the credit step builds
    original = Probe.__init__

    def spy(self, policy, *args, **kwargs):
        probed.append(policy.model)
        original(self, policy, *args, **kwargs)

    monkeypatch.setattr(Probe, "__init__", spy)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and all("lora_" in n for n in changed)  # only the adapter trained
    assert probed and all(isinstance(m, PeftModel) and m is trainer.model for m in probed)
    assert trainer.credit_cost_total["tokens_scored"] > 0


def test_grpo_credit_equals_trls_own_advantages(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, "grpo")
    from trl import GRPOTrainer
    captured = {}
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        out = original(self, inputs)
        captured["trl"] = out["advantages"].clone()
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)
    trainer.model.train()
    batch = [trainer.train_dataset[i] for i in (0, 0, 0, 0)]
    out = trainer._generate_and_score_completions(batch)
    mask = out["completion_mask"].bool()
    ours = out["advantages"]
    assert ours.shape == mask.shape and (ours[~mask] == 0).all()
    expected = captured["trl"][:, None].expand_as(ours) * mask
    assert torch.allclose(ours, expected, atol=1e-5)


def accelerate_launch(n, out, port, per_device):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRL_EXPERIMENTAL_SILENCE": "1",
           "PYTHONPATH": os.pathsep.join([os.path.join(root, "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *(["--multi_gpu"] if n > 1 else []),
           f"--num_processes={n}", "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no",
           f"--main_process_port={port}", os.path.join(root, "examples", "trl_two_process.py"), "--out", out,
           "--per-device", str(per_device)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_give_one_process_advantages_and_update(tmp_path):
    """accelerate launch, 2 CPU processes (gloo) vs 1, fixed completions through TRL's rollout_func."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    from trl_two_process import compare
    accelerate_launch(1, str(tmp_path / "one"), 29541, 8)
    accelerate_launch(2, str(tmp_path / "two"), 29542, 4)
    result = compare(str(tmp_path / "one"), str(tmp_path / "two"), ["rredcot", "sc_grpo"])
    for credit, r in result.items():
        assert r["max_abs_advantage"] > 0.1, credit  # a real signal, not all zeros
        assert r["advantages_max_abs_diff"] <= 1e-6, (credit, r)
        assert r["update_max_abs"] > 1e-3 and r["update_relative_l2_diff"] <= 1e-3, (credit, r)


@pytest.mark.parametrize("setting, value", [("scale_rewards", "none"), ("scale_rewards", "batch"),
                                            ("multi_objective_aggregation", "normalize_then_sum")])
def test_trl_advantage_settings_credo_would_ignore_are_refused(tmp_path, setting, value):
    from trl import GRPOConfig
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, report_to=[],
                      use_cpu=True, bf16=False, **{setting: value})
    with pytest.raises(ValueError, match=f"GRPOConfig.{setting}={value!r}"):
        CreditGRPOTrainer(model=None, reward_funcs=reward_len, args=args, credit="grpo")  # refused before any model


def test_spo_chain_scores_the_old_log_probs_trl_leaves_out_on_policy(tmp_path):
    """On-policy TRL returns no old_per_token_logps; read as zeros (p_old = 1) SPO-chain finds no cut point and
    trains nothing. Scored instead, its advantages are non-zero wherever TRL's are."""
    trainer = make_trainer(tmp_path, "spo_chain")
    trainer.model.train()
    inputs = [trainer.train_dataset[i] for i in (0, 0, 0, 0)]
    for seed in range(8):  # a batch where the rewards differ (else every advantage is 0 by construction)
        torch.manual_seed(seed)
        out = trainer._generate_and_score_completions(inputs)
        if trainer._credo_rewards.std() > 0:
            break
    assert "old_per_token_logps" not in out
    assert trainer._credo_rewards.std() > 0 and out["advantages"].abs().max() > 0


def test_a_dataset_without_answers_is_refused_not_scored_as_all_wrong(tmp_path):
    trainer = make_trainer(tmp_path, "rredcot")
    trainer.model.train()
    with pytest.raises(ValueError, match="'answer' column"):
        trainer._generate_and_score_completions([{"prompt": trainer.train_dataset[0]["prompt"]}] * 4)


def test_the_probe_samples_with_trls_temperature_and_top_p(tmp_path):
    from trl import GRPOConfig
    tokenizer = build_tokenizer()
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, report_to=[], use_cpu=True, bf16=False, temperature=0.7, top_p=0.9)
    trainer = CreditGRPOTrainer(model=tiny_model(tokenizer), processing_class=tokenizer, reward_funcs=reward_len,
                                args=args,
                                train_dataset=datasets.Dataset.from_list([{"prompt": "1+1", "answer": "2"}] * 4),
                                credit="vineppo", task=make_task("gym:chain_sum"))
    assert (trainer.credit_sampling.temperature, trainer.credit_sampling.top_p) == (0.7, 0.9)


def test_a_loss_mask_reaches_trls_loss_as_its_tool_mask(tmp_path):
    """SPO-chain trains only its cut segments: the mask goes to TRL as tool_mask (honoured by the loss, the KL
    term and num_items_in_batch) instead of zeroed advantages, which left the masked tokens in the denominators."""
    trainer = make_trainer(tmp_path, "spo_chain")
    trainer.model.train()
    torch.manual_seed(0)
    out = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in (0, 0, 0, 0)])
    assert "tool_mask" in out  # the estimator's mask went to TRL
    mask = torch.ones_like(out["completion_mask"])
    mask[:, ::2] = 0  # every other token masked out
    trainer._apply_loss_mask(out, mask.bool())
    kept = int((mask * out["completion_mask"]).sum())
    assert int(out["num_items_in_batch"]) == kept and torch.equal(out["tool_mask"], mask.int())
    # a masked token's advantage, however large, does not move the loss
    trainer.current_gradient_accumulation_steps = 1  # set by TRL's training_step, which this test bypasses
    out["advantages"] = torch.where(mask.bool(), torch.full_like(out["advantages"], 0.5),
                                    torch.zeros_like(out["advantages"]))
    base = trainer.compute_loss(trainer.model, dict(out))
    out["advantages"] = torch.where(mask.bool(), out["advantages"], torch.full_like(out["advantages"], 1e3))
    assert torch.allclose(trainer.compute_loss(trainer.model, dict(out)), base)


def conversational_trainer(tmp_path, credit="sc_grpo"):
    """A TRL dataset of conversations: a system message, an earlier exchange, then the problem."""
    from trl import GRPOConfig
    tokenizer = build_tokenizer()
    task = make_task("gym:chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    rows = [{"prompt": [{"role": "system", "content": "Think step by step."},
                        {"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"},
                        {"role": "user", "content": p.prompt}], "answer": p.answer} for p in task.heldout_problems(4)]
    args = GRPOConfig(output_dir=str(tmp_path / credit), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, report_to=[], use_cpu=True, bf16=False, seed=0, save_strategy="no")
    trainer = CreditGRPOTrainer(model=tiny_model(tokenizer), processing_class=tokenizer, reward_funcs=reward_len,
                                args=args, train_dataset=datasets.Dataset.from_list(rows), credit=credit, task=task)
    return trainer, task


def probe_prompt_ids(trainer, rows):
    """The ids the Probe's policy gives each row's problem prompt, and the ids TRL sampled from."""
    trainer._credo_inputs = rows
    theirs = [list(x) for x in trainer._tokenize_prompts([r["prompt"] for r in rows])[0]]
    policy = trainer._probe_policy()
    texts = [r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][-1]["content"] for r in rows]
    ids, mask = policy.encode_prompts(texts)
    ours = [row[m].tolist() for row, m in zip(ids, mask)]
    return policy, ours, theirs


def test_the_probe_renders_text_prompts_as_trl_does_without_a_chat_template(tmp_path):
    """TRL tokenises a text prompt as it is, even when the tokenizer has a chat template; a teacher prompt
    wrapped in the template would differ from the student's in format, and SC-GRPO would read that as credit."""
    trainer = make_trainer(tmp_path, "sc_grpo")
    assert trainer.processing_class.chat_template  # the template exists: TRL still does not use it here
    policy, ours, theirs = probe_prompt_ids(trainer, [trainer.train_dataset[i] for i in range(4)])
    assert ours == theirs and not policy.chat


def test_the_probe_renders_conversations_as_trl_does_whole(tmp_path):
    trainer, task = conversational_trainer(tmp_path)
    rows = [trainer.train_dataset[i] for i in range(4)]
    policy, ours, theirs = probe_prompt_ids(trainer, rows)
    assert ours == theirs and policy.chat
    # SC-GRPO's teacher: the row's whole conversation, the reference joined to its system message
    from credo.core.protocols import Problem
    problem_text = rows[0]["prompt"][-1]["content"]
    teacher = policy.format_prompt(task.reference_prompt(Problem(key=problem_text, prompt=problem_text,
                                                                 answer=rows[0]["answer"]), "REFERENCE-42"))
    assert teacher.startswith("<|system|>Think step by step.\n\n") and "REFERENCE-42" in teacher
    assert "<|user|>1+1\n<|assistant|>2\n" in teacher and teacher.endswith(f"<|user|>{problem_text}\n<|assistant|>")


def test_the_probe_builds_on_the_prompts_trl_rendered_not_the_dataset_rows(tmp_path):
    """With an environment, TRL appends reset()'s observation to the last message before tokenising; the
    Probe must build on that conversation (recorded by _tokenize_prompts), not on the dataset's row."""
    trainer, _ = conversational_trainer(tmp_path)
    rows = [trainer.train_dataset[i] for i in range(4)]
    trainer._credo_inputs = rows
    rendered = [r["prompt"][:-1] + [{"role": "user", "content": r["prompt"][-1]["content"] + " Observation: 7."}]
                for r in rows]
    theirs = [list(x) for x in trainer._tokenize_prompts(rendered)[0]]
    policy = trainer._probe_policy()
    ids, mask = policy.encode_prompts([m[-1]["content"] for m in rendered])
    assert [row[m].tolist() for row, m in zip(ids, mask)] == theirs


def test_rows_that_share_a_last_message_but_not_their_context_are_refused(tmp_path):
    trainer, _ = conversational_trainer(tmp_path)
    rows = [trainer.train_dataset[i] for i in (0, 0)]
    other = dict(rows[1], prompt=[{"role": "system", "content": "Answer tersely."}] + rows[1]["prompt"][1:])
    trainer._credo_inputs = [rows[0], other]
    trainer._tokenize_prompts([rows[0]["prompt"], other["prompt"]])
    with pytest.raises(ValueError, match="same message but differ before it"):
        trainer._probe_policy()


def test_the_probe_tokenises_with_trls_chat_template_kwargs(tmp_path):
    """sanitize_control_tokens (a chat_template_kwargs TRL passes on) works only when tokenising: the probe
    tokenises through the same call, so its ids equal TRL's."""
    trainer, _ = conversational_trainer(tmp_path)
    trainer.chat_template_kwargs = {"sanitize_control_tokens": True}
    rows = [dict(r, prompt=r["prompt"][:-1] + [{"role": "user", "content": r["prompt"][-1]["content"] + " <eos>"}])
            for r in (trainer.train_dataset[i] for i in range(4))]
    policy, ours, theirs = probe_prompt_ids(trainer, rows)
    plain = [list(x) for x in trainer.processing_class.apply_chat_template(
        [r["prompt"] for r in rows], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]]
    assert ours == theirs and ours != plain  # the option changed the ids, and the probe followed it


def test_trls_tool_mask_is_the_estimators_loss_mask(tmp_path, monkeypatch):
    """With tools, TRL's tool_mask is 0 on the tool outputs inside a completion: they stay in the scored
    context (completion_mask) and are the Rollouts' loss mask, over which estimators normalise."""
    from trl import GRPOTrainer
    trainer, _ = conversational_trainer(tmp_path)
    original = GRPOTrainer._generate_and_score_completions

    def with_tool_tokens(self, inputs):
        out = original(self, inputs)
        tool_mask = torch.ones_like(out["completion_mask"])
        tool_mask[:, 2:4] = 0  # two tool tokens in every completion
        out["tool_mask"] = tool_mask
        return out

    seen = {}
    build = trainer._rollouts

    def spy(output, probe):
        seen["rollouts"] = build(output, probe)
        return seen["rollouts"]

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", with_tool_tokens)
    trainer._rollouts = spy
    trainer.model.train()
    torch.manual_seed(0)
    out = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in (0, 0, 0, 0)])
    r = seen["rollouts"]
    assert r.loss_mask is not None and not r.loss_mask[:, 2:4].any()
    assert torch.equal(r.loss_mask, r.completion_mask & out["tool_mask"].bool().cpu())


def test_a_teacher_prompt_that_puts_the_reference_before_the_problem_keeps_the_conversation(tmp_path):
    """arith's teacher prompt is `reference + separator + problem` as one user turn: it ends with the row's
    last message, so it replaces that message inside the row's conversation. A prompt naming no row is refused
    (it would silently lose the system message and the earlier turns)."""
    trainer, _ = conversational_trainer(tmp_path)
    rows = [trainer.train_dataset[i] for i in range(4)]
    policy, _, _ = probe_prompt_ids(trainer, rows)
    problem_text = rows[1]["prompt"][-1]["content"]
    teacher = policy.format_prompt("REFERENCE-42\n---\n" + problem_text)
    assert teacher == ("<|system|>Think step by step.\n<|user|>1+1\n<|assistant|>2\n<|user|>REFERENCE-42\n---\n"
                       f"{problem_text}\n<|assistant|>")
    with pytest.raises(ValueError, match="names no row of this batch"):
        policy.format_prompt("a question nobody asked")
    assert policy.format_prompt("Where is the first wrong step?", system=False) == \
        "<|user|>Where is the first wrong step?\n<|assistant|>"  # SRPO's request: one user turn


TOOLS_TEMPLATE = ("{% if tools %}<|tools|>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}\n{% endif %}"
                  "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def lookup(city: str) -> str:
    """Look a city up.

    Args:
        city: the city's name
    """
    return city


def test_the_probe_renders_each_rows_tools_as_trl_does(tmp_path):
    """With environments, TRL renders each row with its environment's tools (_env_tools[name]); the probe's
    prompts for that row carry the same tools."""
    trainer, _ = conversational_trainer(tmp_path)
    trainer.processing_class.chat_template = TOOLS_TEMPLATE
    rows = [trainer.train_dataset[i] for i in range(4)]
    trainer.environment_factories = {"a": object, "b": object}  # TRL's per-environment branch of _tokenize_prompts
    trainer._env_tools = {"a": [lookup], "b": []}
    trainer._batch_environments = ["a", "b", "a", "b"]
    policy, ours, theirs = probe_prompt_ids(trainer, rows)
    assert ours == theirs
    texts = [policy.format_prompt(r["prompt"][-1]["content"]) for r in rows]
    assert texts[0].startswith("<|tools|>lookup;<|system|>") and texts[1].startswith("<|system|>")


@pytest.mark.parametrize("version, tested", [("1.12.0", True), ("1.13.0", True), ("1.14.1", True), ("1.16.0", True),
                                             ("1.11.0", False), ("1.16.1", False), ("2.0.0", False)])
def test_the_tested_trl_range_is_from_the_oldest_to_the_newest_tested_version(version, tested):
    from credo.integrations.trl_versions import untested_trl_message
    message = untested_trl_message(version)
    assert (message is None) == tested
    if not tested:
        assert f"tested with trl 1.12.0 to 1.16.0; found trl {version}" in message


@pytest.mark.parametrize("version", ["1.15.0", "1.15.2"])
def test_a_trl_inside_the_range_that_fails_the_tests_is_named_with_why(version):
    from credo.integrations.trl_versions import untested_trl_message
    assert untested_trl_message(version).startswith(f"credo.integrations.trl: found trl {version}; trl 1.15's "
                                                    "GRPO loss always takes its fused LM-head path")


@pytest.mark.parametrize("version, warns", [("1.17.0", True), ("1.14.2", False)])
def test_an_untested_trl_warns_instead_of_refusing(monkeypatch, version, warns):
    import importlib.util
    import warnings

    import trl
    import credo.integrations.trl as adapter
    monkeypatch.setattr(trl, "__version__", version)
    spec = importlib.util.spec_from_file_location("credo_trl_reimported", adapter.__file__)
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec.loader.exec_module(module)  # the adapter's import: a refusal would raise here
    untested = [w for w in caught if w.category.__name__ == "UntestedTRLWarning"]
    assert len(untested) == int(warns)
    if warns:
        assert f"found trl {version}" in str(untested[0].message)
    assert issubclass(module.CreditGRPOTrainer, trl.GRPOTrainer)
