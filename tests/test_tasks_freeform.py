import threading

import pytest
import torch

from credo.tasks import make_task
from credo.tasks.jsonl import last_boxed
from credo.core.config import ConfigError


def write(tmp_path, lines):
    path = tmp_path / "math.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_malformed_row_names_its_line_and_can_be_skipped(tmp_path, capsys):
    path = write(tmp_path, ['{"question": "1+1?", "answer": "2"}', '{"question": "no answer"}', "not json",
                            '{"question": "half of 1?", "answer": "\\\\frac{1}{2}"}'])
    with pytest.raises(ValueError, match=r"math.jsonl:2: .*answer"):
        make_task(f"jsonl:{path}")
    task = make_task(f"jsonl:{path}", {"skip_bad_rows": True})
    assert "skipped 2 malformed row(s)" in capsys.readouterr().err
    problems = task.train_problems(20, torch.Generator().manual_seed(0)) + task.heldout_problems(5)
    assert {p.answer for p in problems} <= {"2", "\\frac{1}{2}"}
    with pytest.raises(ValueError, match="unknown config field 'task.skip_bad'"):
        make_task(f"jsonl:{path}", {"skip_bad": True})


def test_boxed_extraction_and_math_verify_on_and_off_the_main_thread(tmp_path):
    path = write(tmp_path,
                 ['{"question": "half of 1?", "answer": "\\\\frac{1}{2}"}', '{"question": "1+1?", "answer": "2"}'])
    task = make_task(f"jsonl:{path}", {"heldout_permille": 0})
    p = task.heldout_problems(1)[0]
    assert last_boxed("so \\boxed{3} no, \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert task.reward(p, "It is \\boxed{0.5}") == 1.0
    assert task.reward(p, "It is \\boxed{0.6}") == 0.0 and task.reward(p, "no box") == 0.0
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("r", task.reward(p, "\\boxed{1/2}")))
    thread.start()
    thread.join()
    assert result["r"] == 1.0


def test_gym_task_splits_disjoint_and_scorer(tmp_path):
    task = make_task("gym:chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    held = {p.key for p in task.heldout_problems(1000)}
    train = task.train_problems(200, torch.Generator().manual_seed(0))
    assert not held & {p.key for p in train}
    p = train[0]
    assert task.reward(p, f"think <answer>{p.answer}</answer>") == 1.0
    assert task.reward(p, "<answer>nonsense</answer>") == 0.0
    assert task.answer_probe("7") == ("\n<answer>", "7</answer>")
    with pytest.raises(ValueError, match="gym:no_such_dataset"):
        make_task("gym:no_such_dataset")


def test_gym_validation_split_is_a_fixed_sequence_apart_from_held_out_and_training_draws():
    # three one-digit terms: a space small enough that unfiltered draws would meet the held-out and validation sets
    options = {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}
    task = make_task("gym:chain_sum", options)
    validation = task.validation_problems(300)
    keys = [p.key for p in validation]
    assert len(set(keys)) == 300
    assert not set(keys) & {p.key for p in task.heldout_problems(1000)}
    again = make_task("gym:chain_sum", options)
    assert [p.key for p in again.validation_problems(100)] == keys[:100]  # the same on every machine, prefixes agree
    assert [p.key for p in again.validation_problems(300)] == keys
    again.train_exclude = frozenset(keys)
    drawn = again.train_problems(3000, torch.Generator().manual_seed(0))
    assert len(drawn) == 3000 and not {p.key for p in drawn} & set(keys)
    tiny = make_task("gym:chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    held = {p.key for p in tiny.heldout_problems(1000)}
    few = {p.key for p in tiny.validation_problems(5000)}
    assert few and not few & held and len(few) < 5000  # as many as the options leave outside the held-out set


def test_jsonl_solution_field_becomes_the_reference_solution(tmp_path):
    path = write(tmp_path, ['{"question": "2+3*4?", "answer": "14", "solution": "3*4=12\\n\\n2+12=14"}',
                            '{"question": "1+1?", "answer": "2", "solution": "1+1=2\\nso \\\\boxed{2}"}',
                            '{"question": "2+2?", "answer": "4"}'])
    task = make_task(f"jsonl:{path}")
    by_q = {p.prompt: p for p in task.train + task.heldout}
    steps = task.reference_solution(by_q["2+3*4?"])
    assert steps == ["3*4=12\n\n", "2+12=14", "\nThe final answer is \\boxed{14}"]  # no boxed answer: template added
    assert task.reference_solution(by_q["1+1?"]) == ["1+1=2\n", "so \\boxed{2}"]
    assert task.reward(by_q["1+1?"], "".join(task.reference_solution(by_q["1+1?"]))) == 1.0
    assert task.reference_solution(by_q["2+2?"]) is None


def test_one_heldout_hash_split_for_every_task():
    """arith and jsonl once split by two spellings of the same hash; both now call tasks.base.in_heldout_split."""
    import hashlib

    from credo.tasks.base import in_heldout_split
    keys = [f"question {i}" for i in range(2000)]
    for permille in (0, 100, 500, 1000):
        assert [in_heldout_split(k, permille) for k in keys] == \
            [int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) % 1000 < permille for k in keys]
    assert 150 < sum(in_heldout_split(k, 100) for k in keys) < 250


def test_gym_step_labels_mark_the_first_wrong_line_of_a_running_sum():
    from credo.tasks.gym import running_sum_step_truth
    task = make_task("gym:chain_sum", {"min_terms": 4, "max_terms": 4, "min_digits": 1, "max_digits": 1,
                                       "step_labels": True})
    assert task.has_step_labels and task.default_segmenter == "lines"
    extract = task.extract_answer
    right = "5 - 5 = 0\n0 + 4 = 4\n4 + 1 = 5\n<answer>5</answer>"
    truth = running_sum_step_truth("5 - 5 + 4 + 1", right, extract)
    assert truth.correct == (True, True, True, True) and truth.first_error is None
    slip = "5 - 5 = 0\n0 + 4 = 3\n3 + 1 = 4\n<answer>4</answer>"  # one slip, carried on consistently
    assert running_sum_step_truth("5 - 5 + 4 + 1", slip, extract).correct == (True, False, True, True)
    copied = "5 - 5 = 0\n0 + 4 = 3\n4 + 1 = 5\n<answer>5</answer>"  # the next line ignores what was written
    assert running_sum_step_truth("5 - 5 + 4 + 1", copied, extract).correct == (True, False, False, True)
    assert running_sum_step_truth("5 - 5 + 4 + 1", "5 - 5 = 0\n0 + 4 = 4", extract).first_error == 2
    assert running_sum_step_truth("5 - 5 + 4 + 1", right + "\nmore", extract).first_error == 4
    assert running_sum_step_truth("5 - 5 + 4 + 1", "5 + 5 = 10\n10 + 4 = 14\n14 + 1 = 15\n<answer>15</answer>",
                                  extract).first_error == 0  # the wrong operator
    assert running_sum_step_truth("2 * 3", right, extract) is None
    kinds = {slip: (1, "result"), copied: (1, "result"),
             "5 - 5 = 0\n1 + 4 = 5\n5 + 1 = 6\n<answer>6</answer>": (1, "carry"),
             "4 - 5 = -1\n-1 + 4 = 3\n3 + 1 = 4\n<answer>4</answer>": (0, "operand"),  # the problem's first term
             "5 - 5 = 0\n0 + 3 = 3\n3 + 1 = 4\n<answer>4</answer>": (1, "operand"),
             "5 + 5 = 10\n10 + 4 = 14\n14 + 1 = 15\n<answer>15</answer>": (0, "operator"),
             "5 - 5 = 0\n0 + 4 = 4\n<answer>4</answer>": (2, "early answer"),
             "5 - 5 = 0\n0 + 4 = 4\n4 + 1 = 5\n<answer>6</answer>": (3, "answer"),
             "5 - 5 = 0\nzero plus four\n": (1, "unreadable"), "5 - 5 = 0\n0 + 4 = 4": (2, "missing"),
             right + "\nmore": (4, "extra")}
    for text, expected in kinds.items():
        truth = running_sum_step_truth("5 - 5 + 4 + 1", text, extract)
        assert (truth.first_error, truth.first_slip) == expected, text
    assert running_sum_step_truth("5 - 5 + 4 + 1", right, extract).first_slip is None
    problem = task.heldout_problems(1)[0]
    worked = task.worked_solution(problem) + "\n<answer>" + problem.answer + "</answer>"
    assert task.step_truth(problem, worked).first_error is None and task.reward(problem, worked) == 1.0


def test_gym_step_labels_are_off_by_default_and_refused_where_steps_are_not_a_chain():
    plain = make_task("gym:chain_sum", {"min_terms": 2, "max_terms": 2})
    assert not plain.has_step_labels and plain.default_segmenter == "keyword_entropy"
    assert plain.step_truth(plain.heldout_problems(1)[0], "1 + 1 = 2\n<answer>2</answer>") is None
    with pytest.raises(ConfigError, match="task_options.step_labels"):
        make_task("gym:chain_sum", {"step_labels": "yes"})
    with pytest.raises(ConfigError, match="task_options.step_labels: gym:basic_arithmetic"):
        make_task("gym:basic_arithmetic", {"step_labels": True, "min_terms": 3, "max_terms": 3, "operators": ["*"]})
