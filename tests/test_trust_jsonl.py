"""jsonl tasks: disjoint splits even with repeated questions, true held-out n, skippable non-UTF-8 rows."""

from __future__ import annotations

import json

import torch

from credo.cli.main import main
from credo.tasks import make_task


def write_rows(path, questions):
    path.write_text("".join(json.dumps({"question": q, "answer": str(len(q))}) + "\n" for q in questions))
    return str(path)


def test_repeated_questions_never_land_on_both_sides(tmp_path):
    questions = [f"q{i % 40}?" for i in range(400)]  # every question 10 times
    task = make_task(f"jsonl:{write_rows(tmp_path / 'd.jsonl', questions)}", {"heldout_permille": 300})
    held = [p.key for p in task.heldout_problems(1000)]
    train = {p.key for p in task.train_problems(2000, torch.Generator().manual_seed(0))}
    assert len(held) == len(set(held)) and 0 < len(held) < 40
    assert not set(held) & train
    assert set(held) | train == set(questions)


def test_eval_reports_the_true_number_of_held_out_problems(tmp_path, saved_policy, capsys):
    path = write_rows(tmp_path / "d.jsonl", [f"{i}+{i}?" for i in range(30)])
    held = len(make_task(f"jsonl:{path}").heldout_problems(1000))
    assert main(["eval", "--checkpoint", saved_policy, "--task", f"jsonl:{path}", "--n", "500",
                 "--max-new-tokens", "2", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert result["n"] == held < 500


def test_non_utf8_rows_name_the_line_and_are_skippable(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    good = [json.dumps({"question": f"{i}?", "answer": "1"}).encode() for i in range(5)]
    path.write_bytes(b"\n".join(good[:2] + [b'{"question": "\xff\xfe", "answer": "1"}'] + good[2:]) + b"\n")
    try:
        make_task(f"jsonl:{path}")
        raise AssertionError("a non-UTF-8 row was accepted")
    except ValueError as err:
        assert str(err).startswith(f"{path}:3: not UTF-8 (byte 14)") and "skip_bad_rows" in str(err)
    task = make_task(f"jsonl:{path}", {"skip_bad_rows": True})
    assert "skipped 1 malformed row(s); first: " + f"{path}:3: not UTF-8" in capsys.readouterr().err
    assert len(task.heldout) + len(task.train) == 5


def test_a_lone_surrogate_is_a_row_error_that_skip_bad_rows_skips(tmp_path, capsys):
    """Valid JSON (\\ud800 is a legal escape), but no UTF-8 text: before, a UnicodeEncodeError traceback in eval
    and train, at the first prompt or log line that held it, and skip_bad_rows did not skip it."""
    path = tmp_path / "d.jsonl"
    rows = [json.dumps({"question": f"{i}?", "answer": "1"}) for i in range(5)]
    rows[1] = '{"question": "1?", "answer": "1", "solution": "x \\udc80 y"}'
    rows[3] = '{"question": "ok \\ud83d\\ude00?", "answer": "1"}'  # a surrogate pair: one character, fine
    path.write_text("\n".join(rows) + "\n")
    try:
        make_task(f"jsonl:{path}")
        raise AssertionError("a lone surrogate was accepted")
    except ValueError as err:
        assert str(err).startswith(f"{path}:2: solution holds a lone UTF-16 surrogate (\\udc80 at character 2)")
    task = make_task(f"jsonl:{path}", {"skip_bad_rows": True})
    assert f"skipped 1 malformed row(s); first: {path}:2: solution holds" in capsys.readouterr().err
    problems = task.heldout + task.train
    assert len(problems) == 4 and all(p.prompt.encode("utf-8") for p in problems)
    assert "ok \U0001f600?" in {p.prompt for p in problems}
