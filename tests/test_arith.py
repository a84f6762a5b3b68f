import torch

from credo.tasks.arith import ArithConfig, ArithTask
from credo.core.protocols import Problem


def problem(terms, ops):
    total = terms[0]
    for o, t in zip(ops, terms[1:]):
        total = total + t if o == "+" else total - t
    key = str(terms[0]) + "".join(f"{o}{t}" for o, t in zip(ops, terms[1:]))
    return Problem(key, key + "\n", str(total), {"terms": terms, "ops": ops})


def test_solution_is_correct_and_has_no_error():
    task = ArithTask()
    p = problem([37, 48, 12, 55], ["+", "-", "+"])
    sol = task.solution(p)
    assert sol == "37+48=85\n85-12=73\n73+55=128\n#### 128"
    assert task.is_correct(p, sol) and task.reward(p, sol) == 1.0
    truth = task.step_truth(p, sol)
    assert truth.correct == (True, True, True, True) and truth.first_error is None


def test_step_labels_of_hand_written_completions():
    task = ArithTask()
    p = problem([37, 48, 12, 55], ["+", "-", "+"])
    # slip at step 2 carried forward correctly: only step 2 (index 1) is wrong
    t = task.step_truth(p, "37+48=85\n85-12=74\n74+55=129\n#### 129")
    assert t.correct == (True, False, True, True) and t.first_error == 1
    assert not task.is_correct(p, "37+48=85\n85-12=74\n74+55=129\n#### 129")
    # wrong operand copied from the problem
    assert task.step_truth(p, "37+48=85\n85-21=64\n64+55=119\n#### 119").first_error == 1
    # answer line disagrees with the last written value
    assert task.step_truth(p, "37+48=85\n85-12=73\n73+55=128\n#### 127").first_error == 3
    # garbage first line
    assert task.step_truth(p, "3+48=85\n85-12=73\n73+55=128\n#### 128").first_error == 0
    # stops early with an answer: the answer line sits where step 3 belongs
    assert task.step_truth(p, "37+48=85\n85-12=73\n#### 73").first_error == 2
    # truncated with no answer: the missing line is the error
    assert task.step_truth(p, "37+48=85\n85-12=73\n").first_error == 2
    # extra lines after a correct answer are errors
    assert task.step_truth(p, "37+48=85\n85-12=73\n73+55=128\n#### 128\n1+1=2").first_error == 4
    assert task.step_truth(p, "").first_error == 0


def test_the_first_errors_kind_is_what_a_checker_must_notice():
    from credo.tasks.base import SLIPS
    task = ArithTask()
    p = problem([37, 48, 12, 55], ["+", "-", "+"])
    kinds = {"37+48=85\n85-12=74\n74+55=129\n#### 129": (1, "result"),
             "37+48=85\n85-21=64\n64+55=119\n#### 119": (1, "operand"),
             "37+48=85\n85+12=97\n97+55=152\n#### 152": (1, "operator"),
             "37+48=85\n84-12=72\n72+55=127\n#### 127": (1, "carry"),
             "3+48=51\n51-12=39\n39+55=94\n#### 94": (0, "operand"),  # the problem's first term, miscopied
             "37+48=85\n85-12=73\n73+55=128\n#### 127": (3, "answer"),
             "37+48=85\n85-12=73\n#### 73": (2, "early answer"),
             "37+48=85\n85-12=73\nthen 55\n#### 128": (2, "unreadable"),
             "37+48=85\n85-12=73\n": (2, "missing"),
             "37+48=85\n85-12=73\n73+55=128\n#### 128\n1+1=2": (4, "extra")}
    for text, (first, kind) in kinds.items():
        truth = task.step_truth(p, text)
        assert (truth.first_error, truth.first_slip) == (first, kind), text
    assert {kind for _, kind in kinds.values()} == set(SLIPS)  # every kind is reachable, and none is unnamed
    assert task.step_truth(p, task.solution(p)).first_slip is None


def test_answer_extraction_requires_the_answer_line_last():
    task = ArithTask()
    p = problem([10, 5], ["+"])
    assert task.is_correct(p, "10+5=15\n#### 15")
    assert not task.is_correct(p, "#### 15\n10+5=15")
    assert not task.is_correct(p, "10+5=15\n#### 150")


def test_splits_are_disjoint_and_heldout_is_fixed():
    task = ArithTask()
    held = task.heldout_problems(300)
    assert len({p.key for p in held}) == 300
    assert held[:10] == ArithTask().heldout_problems(10)
    train = task.train_problems(3000, torch.Generator().manual_seed(0))
    assert not {p.key for p in held} & {p.key for p in train}
    assert all(task.is_heldout(p) for p in held) and not any(task.is_heldout(p) for p in train)


def test_difficulty_config_and_no_negative_totals():
    task = ArithTask(ArithConfig(min_terms=4, max_terms=4, digits=1, ops="+-"))
    for p in task.train_problems(200, torch.Generator().manual_seed(1)):
        assert len(p.data["terms"]) == 4 and all(0 <= t <= 9 for t in p.data["terms"])
        total = p.data["terms"][0]
        for o, t in zip(p.data["ops"], p.data["terms"][1:]):
            total = total + t if o == "+" else total - t
            assert total >= 0
        assert task.is_correct(p, task.solution(p))
