"""Prompts longer than the model: a task prompt that does not fit the model's context with
max_new_tokens is one line naming its row and both lengths, before --out is claimed; task_options.
truncate_prompts cuts it to fit instead; and a batch's memory is bounded by its longest row (sub-batches)."""

from __future__ import annotations

import json

import pytest
import torch

from credo.cli.main import main
from credo.policy import load_policy
from credo.core.protocols import SamplingConfig
from credo.policy.base import row_chunks
from credo.policy.gpt import GPTConfig
from credo.policy.hf import HFPolicy
from credo.policy.tiny import TinyPolicy
from credo.train.sft import make_tokenizer
from builders import build_tokenizer, one_line_error, save_tiny_llama, snapshot, tiny_llama

LONG = "State the final answer to the following arithmetic problem: " * 20 + "4 - 1 - 7 ="


def write_rows(path, questions) -> str:
    path.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in questions))
    return str(path)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    """A tiny chat Llama with a context of 128 positions, saved as a Hugging Face model directory."""
    return save_tiny_llama(str(tmp_path_factory.mktemp("hf") / "model"), max_positions=128)


def test_a_prompt_longer_than_the_context_names_its_row_and_both_lengths(hf_dir, tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", [f"{i} + 1 =" for i in range(8)] + [LONG])
    line = one_line_error(capsys, ["eval", "--checkpoint", hf_dir, "--task", f"jsonl:{data}", "--n", "2",
                                   "--max-new-tokens", "8", "--quiet"])
    assert f"eval.checkpoint: {data}:9: the prompt is " in line
    assert "context of 128 tokens" in line and "truncate_prompts" in line
    length = int(line.split("the prompt is ")[1].split()[0])
    assert length > 128 and f"it needs {length + 8}," in line


@pytest.mark.parametrize("command", ["show", "audit"])
def test_show_and_audit_refuse_it_before_out(hf_dir, tmp_path, capsys, command):
    data = write_rows(tmp_path / "d.jsonl", [f"{i} + 1 =" for i in range(8)] + [LONG])
    out = tmp_path / "out"
    before = snapshot(str(tmp_path))
    line = one_line_error(capsys, [command, "--checkpoint", hf_dir, "--task", f"jsonl:{data}", "--n", "2",
                                   "--set", "group_size=2", "--set", "max_new_tokens=8", "--out", str(out), "--quiet"])
    assert f"{command}.checkpoint: {data}:9: the prompt is " in line
    assert not out.exists() and snapshot(str(tmp_path)) == before


def test_max_new_tokens_alone_counts_against_the_context(hf_dir, tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", [f"{i} + 1 =" for i in range(8)])
    line = one_line_error(capsys, ["eval", "--checkpoint", hf_dir, "--task", f"jsonl:{data}", "--n", "2",
                                   "--max-new-tokens", "120", "--quiet"])
    assert "with 120 new token(s) (max_new_tokens)" in line and "context of 128 tokens" in line


def test_truncate_prompts_cuts_the_start_of_a_long_prompt_to_fit(hf_dir, tmp_path, capsys):
    data = write_rows(tmp_path / "d.jsonl", [f"{i} + 1 =" for i in range(8)] + [LONG])
    assert main(["eval", "--checkpoint", hf_dir, "--task", f"jsonl:{data}", "--n", "20", "--max-new-tokens", "8",
                 "--set", "task_options.truncate_prompts=true", "--quiet"]) == 0
    from credo.policy import bind_task
    from credo.tasks import make_task
    task = make_task(f"jsonl:{data}", {"truncate_prompts": True})
    policy = bind_task(load_policy(hf_dir), task, check_as="eval.checkpoint", max_new_tokens=8)
    assert policy.max_prompt_tokens == 120
    row = policy.prompt_row(LONG)
    assert 110 <= len(row) <= 120  # as much of the question as fits
    text = policy.tokenizer.decode(row)
    assert "<|user|>…" in text and text.endswith("4 - 1 - 7 =\n<|assistant|>")


def test_a_short_prompt_is_never_cut(hf_dir):
    policy = load_policy(hf_dir)
    untouched = policy.prompt_row("1 + 1 =")
    policy.max_prompt_tokens = 120
    assert policy.prompt_row("1 + 1 =") == untouched


def test_the_tiny_gpt_max_len_is_checked_too(tmp_path, capsys):
    tok = make_tokenizer()
    start = str(tmp_path / "start")
    config = GPTConfig(vocab_size=tok.vocab_size, n_layer=1, d_model=16, n_head=2, max_len=64)
    TinyPolicy.create(config, tok).save(start)
    data = write_rows(tmp_path / "d.jsonl", [f"{i}+1=" for i in range(8)] + ["1+" * 40 + "1="])
    line = one_line_error(capsys, ["eval", "--checkpoint", start, "--task", f"jsonl:{data}", "--n", "2", "--quiet"])
    assert f"{data}:9: the prompt is 83 tokens, and with 1 new token(s)" in line and "context of 64 tokens" in line
    assert main(["eval", "--checkpoint", start, "--task", f"jsonl:{data}", "--n", "20", "--max-new-tokens", "4",
                 "--set", "task_options.truncate_prompts=true", "--quiet"]) == 0


def test_row_chunks_bound_every_sub_batch_by_its_longest_row():
    mask = torch.zeros(6, 10, dtype=torch.bool)
    for row, length in enumerate([2, 2, 10, 2, 2, 2]):
        mask[row, 10 - length:] = True
    assert [c.tolist() for c in row_chunks(mask, 2, 72)] == [list(range(6))]  # 6 x 12 fits: one chunk, as before
    chunks = [c.tolist() for c in row_chunks(mask, 2, 24)]
    assert sum(chunks, []) == list(range(6))
    for rows in chunks:
        assert len(rows) == 1 or len(rows) * (max(int(mask[r].sum()) for r in rows) + 2) <= 24
    assert [c.tolist() for c in row_chunks(mask, 2, 5)] == [[r] for r in range(6)]  # a row alone over it: alone


def widest_pass(policy: HFPolicy, run) -> tuple[int, object]:
    """(the most padded tokens, rows x keys, one model call of run() held; what run() returned)."""
    widths = []
    hook = policy.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["attention_mask"].numel()), with_kwargs=True)
    try:
        result = run()
    finally:
        hook.remove()
    return max(widths), result


def test_a_batch_with_long_rows_is_sampled_and_scored_in_bounded_sub_batches():
    """Three long questions among 12 prompts x 2 samples: no model call holds more than max_batch_tokens (one
    whole-batch pass held 24 x the longest row), and scoring in sub-batches gives the whole batch's numbers."""
    tokenizer = build_tokenizer()
    policy = HFPolicy(tiny_llama(tokenizer, max_positions=1024), tokenizer, chat=True)
    prompts = [LONG if i in (2, 6, 9) else f"{i} + 1 =" for i in range(12) for _ in range(2)]
    ids, mask = policy.encode_prompts(prompts)
    sampling = SamplingConfig(max_new_tokens=3)
    whole = ids.shape[0] * (ids.shape[1] + 3)
    policy.max_batch_tokens = whole // 6
    widest, out = widest_pass(policy, lambda: policy.sample(ids, mask, sampling, torch.Generator().manual_seed(0)))
    assert widest <= policy.max_batch_tokens < whole
    assert out.completion_ids.shape[0] == 24 and (out.logprobs[~out.completion_mask] == 0).all()
    again = policy.sample(ids, mask, sampling, torch.Generator().manual_seed(0))
    assert torch.equal(again.completion_ids, out.completion_ids)  # same seed, same samples
    with torch.no_grad():
        widest, (chunked, _) = widest_pass(policy, lambda: policy.score(ids, mask, out.completion_ids,
                                                                       out.completion_mask))
        assert widest <= policy.max_batch_tokens
        policy.max_batch_tokens = whole
        full, _ = policy.score(ids, mask, out.completion_ids, out.completion_mask)
    assert torch.allclose(chunked, full, atol=1e-4)


def test_show_displays_the_truncated_prompt_the_model_read(hf_dir, tmp_path, capsys):
    """With truncate_prompts the model reads the end of a long question: `credo show` displays that (before, the
    uncut question, which the model never read)."""
    from credo.policy import bind_task
    from credo.policy.base import prompt_as_read
    from credo.tasks import make_task
    data = write_rows(tmp_path / "d.jsonl", [LONG] * 1 + [LONG.replace("4 - 1 - 7", f"{i} - 2")
                                                            for i in range(40)])
    task = make_task(f"jsonl:{data}", {"truncate_prompts": True, "heldout_permille": 500})
    policy = bind_task(load_policy(hf_dir), task, check_as="show.checkpoint", max_new_tokens=6)
    read = prompt_as_read(policy, LONG)
    assert read.user.startswith("…") and LONG.endswith(read.user[1:]) and len(read.user) < len(LONG)
    assert policy.tokenizer.decode(policy.prompt_row(LONG)).count(read.user) == 1  # exactly what it encodes
    assert main(["show", "--checkpoint", hf_dir, "--task", f"jsonl:{data}", "--n", "2", "--methods", "grpo",
                 "--set", "group_size=2", "--set", "max_new_tokens=6", "--set", "task_options.truncate_prompts=true",
                 "--set", "task_options.heldout_permille=500", "--out", str(tmp_path / "out"), "--terminal",
                 "--quiet"]) == 0
    shown = capsys.readouterr().out
    assert "): …" in shown and LONG[:40] not in shown


def test_the_context_check_tokenises_only_prompts_that_might_not_fit(hf_dir):
    """A long file of short questions is cleared by a byte bound (before: every row rendered and tokenised, 28 s
    for 100,000 rows); every prompt over the context is still among those measured, and a tokenizer for which the
    bound fails has every prompt measured."""
    import random
    from credo.policy.locate import BOUND_SAMPLE, may_not_fit
    from credo.core.protocols import Problem
    policy = load_policy(hf_dir)
    rng = random.Random(0)
    numbers = [" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(1, 40)))
               for _ in range(400)]
    problems = [Problem(str(i), text + " é ✓ =", "1") for i, text in enumerate(numbers)]
    room = 90
    over = {p.key for p in problems if len(policy.prompt_row(p.prompt)) > room}
    measured = {p.key for p in may_not_fit(policy, problems, room)}
    assert over and over <= measured and len(measured) < len(problems)
    short = [Problem(str(i), f"{i} + 1 =", "1") for i in range(1000)]
    assert len(may_not_fit(policy, short, room)) == BOUND_SAMPLE
    real = policy.prompt_row
    policy.prompt_row = lambda text, system=True: real(text, system) * (1 if text == "" else 4)  # 4 tokens a byte
    assert len(may_not_fit(policy, short, room)) == len(short)
