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
