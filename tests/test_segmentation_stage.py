"""Segmentation is one stage of the data path: the batch's segments are cut once, by the task's own
segmenter, and every segment-level estimator reads them (an explicit `segmenter` option still wins)."""

import torch

from builders import THREE_TERMS, probe_for, scored_rollouts
from credo import credit
from credo.core.rollouts import Rollouts
from credo.core.segment import segment_bounds, segments_for, with_segments
from credo.tasks.arith import ArithTask
from credo.core.protocols import Problem
from credo.tasks.chat import FreeFormTask

P = THREE_TERMS
TEXTS = ["12+13=25\n25+14=39\n\n#### 39", "12+13=25\n25+14=38\n\n#### 38", "12+13=25 25+14=39\n#### 39",
         "12+13=26\n26+14=40\n\n#### 40"]


class FreeFormArith(FreeFormTask):
    """A free-form task (FreeFormTask's defaults, keyword_entropy segments) over arithmetic problems, so the
    tiny character policy can read it."""

    name = "freeform-arith"

    def __init__(self) -> None:
        self.arith = ArithTask()

    def extract_answer(self, completion: str) -> str | None:
        return self.arith.extract_answer(completion)

    def check_answer(self, problem: Problem, answer: str) -> bool:
        return self.arith.check_answer(problem, answer)

    def answer_probe(self, answer: str) -> tuple[str, str]:
        return self.arith.answer_probe(answer)


def batch(policy, task) -> Rollouts:
    """TEXTS as completions of P (one group), scored by the policy."""
    return scored_rollouts(policy, task, [P] * len(TEXTS), TEXTS)


def counts(segment_ids: torch.Tensor) -> list[int]:
    return [len(b) for b in segment_bounds(segment_ids)]


def test_free_form_task_is_segmented_by_its_own_segmenter_not_by_lines(policy):
    """bug: FreeFormTask.default_segmenter (keyword_entropy) was never read, so chat tasks were cut by lines."""
    task = FreeFormArith()
    r = batch(policy, task)
    probe = probe_for(policy, task, max_new_tokens=8)
    by_task, by_lines = probe.segment(r, "keyword_entropy"), probe.segment(r, "lines")
    assert counts(by_task) != counts(by_lines)  # the batch tells the two apart
    for name, options in (("rredcot", {}), ("loo", {}), ("vineppo", {"k": 2})):
        out = credit.get(name)(r, probe_for(policy, task, max_new_tokens=8), credit.get(name).make_config(options))
        assert [len(c) for c in out.segment_credit] == counts(by_task), name
    assert torch.equal(with_segments(r, probe).segment_ids, by_task)


def test_an_explicit_segmenter_option_wins(policy):
    task = FreeFormArith()
    r = batch(policy, task)
    out = credit.get("rredcot")(r, probe_for(policy, task, max_new_tokens=8),
                                credit.get("rredcot").make_config({"segmenter": "lines"}))
    assert [len(c) for c in out.segment_credit] == counts(probe_for(policy, task, max_new_tokens=8).segment(r, "lines"))


def test_estimators_read_the_batch_segments_when_filled(policy):
    """The audit (and any caller of the stage) fills rollouts.segment_ids once; estimators read them."""
    task = ArithTask()
    r = batch(policy, task)
    fixed = probe_for(policy, task, max_new_tokens=8).segment(r, {"name": "fixed", "n": 5})
    assert counts(fixed) != counts(probe_for(policy, task, max_new_tokens=8).segment(r, "lines"))
    filled = r.with_fields(segment_ids=fixed)
    assert with_segments(filled, None) is filled  # filled once: the stage leaves it alone
    for name in ("rredcot", "vineppo"):
        options = {"k": 2} if name == "vineppo" else {}
        out = credit.get(name)(filled, probe_for(policy, task, max_new_tokens=8), credit.get(name).make_config(options))
        assert [len(c) for c in out.segment_credit] == counts(fixed), name


def test_arith_keeps_its_line_segments(policy):
    task = ArithTask()
    r = batch(policy, task)
    probe = probe_for(policy, task, max_new_tokens=8)
    assert torch.equal(segments_for(r, probe), probe.segment(r, "lines"))


def test_the_audit_segments_by_the_task_unless_told():
    from credo.lab.audit.config import AuditConfig
    from credo.lab.audit.reference import with_task_segmenter
    assert with_task_segmenter(AuditConfig(), ArithTask()).segmenter == "lines"  # the cache key as before
    assert with_task_segmenter(AuditConfig(), FreeFormArith()).segmenter == "keyword_entropy"
    assert with_task_segmenter(AuditConfig(segmenter="fixed"), FreeFormArith()).segmenter == "fixed"
