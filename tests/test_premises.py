"""Premise checks of `credo audit`: the teacher check, the localisation check, the privileged twins."""

import math
import random

import pytest
import torch

from builders import CHAIN, rollouts_of
from credo import credit
from credo.core.config import ConfigError
from credo.lab.audit.config import AuditConfig
from credo.lab.audit.premises import parse_figures
from credo.lab.audit.run import audit_localisers
from credo.lab.audit.premises import (conditions_on_solution, kl_argmax_hits, teacher_gain, teacher_table,
                                  teacher_warning, unprivileged_twins)
from credo.lab.audit.report import Labels, parse_method
from credo.core.values import MCValues
from credo.policy.gpt import GPTConfig
from credo.policy.tiny import TinyPolicy
from credo.core.probe import Probe
from credo.core.protocols import SamplingConfig
from credo.train.sft import make_tokenizer
from credo.train.sft_config import sft_config_for
from credo.strategies.localisers import LOCALISERS, localise
from credo.core.registry import Entry
from credo.tasks.arith import ArithTask

RIGHT = "3+4=7\n7+5=12\n12+6=18\n18+7=25\n#### 25"
TEXTS = [RIGHT, "3+4=7\n7+5=13\n13+6=19\n19+7=26\n#### 26", "3+4=7\n7+5=12\n12+6=17\n17+7=24\n#### 24",
         "3+4=8\n8+5=13\n13+6=19\n19+7=26\n#### 26"]
FIRST = [None, 1, 2, 0]
SLIPS = [None, "result", "result", "result"]  # each wrong trace's first line has a wrong sum


class StubPolicy:
    """The tiny policy's encoding, with logits chosen by the test: the completion's own token at each position
    (so the context is ignored), or with `bump` > 0 for a teacher (a prompt holding the reference separator)
    the token its reference has there, up to the first position where the completion leaves it."""

    def __init__(self, real: TinyPolicy, bump: float) -> None:
        self.real, self.bump, self.model = real, bump, real.model
        self.tokenizer = real.tokenizer

    def encode_prompts(self, texts, system=True):
        return self.real.encode_prompts(texts, system)

    def encode_continuation(self, text, eos=False):
        return self.real.encode_continuation(text, eos)

    def decode(self, ids):
        return self.real.decode(ids)

    def completion_logits(self, prompt_ids, prompt_mask, completion_ids, completion_mask):
        B, T = completion_ids.shape
        logits = torch.zeros(B, T, self.tokenizer.vocab_size)
        logits.scatter_(2, completion_ids[..., None], 1.0)  # context-free: the same for teacher and student
        if self.bump:
            for b in range(B):
                text = self.real.decode(prompt_ids[b])
                if "|" in text:  # the teacher: its mass on its reference's token, up to where the two part
                    ref = self.real.encode_continuation(text.split("|")[0])
                    for t in range(min(T, len(ref))):
                        logits[b, t] = 0.0
                        logits[b, t, ref[t]] = self.bump
                        if ref[t] != int(completion_ids[b, t]):
                            break
        return logits

    def score(self, prompt_ids, prompt_mask, completion_ids, completion_mask, entropy=False):
        logits = self.completion_logits(prompt_ids, prompt_mask, completion_ids, completion_mask)
        logp = torch.log_softmax(logits, -1).gather(2, completion_ids[..., None])[..., 0]
        return logp * completion_mask, None


@pytest.fixture
def batch(policy):
    task = ArithTask()
    return task, rollouts_of(policy, task, TEXTS, CHAIN)


def test_each_wrong_trace_is_labelled_with_its_first_error_and_its_kind(batch):
    from types import SimpleNamespace
    from credo.lab.audit.report import labelled_errors
    task, rollouts = batch
    assert labelled_errors(task, rollouts) == (FIRST, SLIPS)
    carried = rollouts.with_fields(completions=[RIGHT, "3+4=7\n8+5=13\n13+6=19\n19+7=26\n#### 26", RIGHT, RIGHT],
                                   correct=torch.tensor([True, False, True, True]))
    assert labelled_errors(task, carried) == ([None, 1, None, None], [None, "carry", None, None])
    unlabelled = SimpleNamespace(has_step_labels=False)
    assert labelled_errors(unlabelled, rollouts) == ([None] * 4, [None] * 4)


def test_a_teacher_that_ignores_its_context_gains_nothing_and_is_not_warned(policy, batch):
    task, rollouts = batch
    check = teacher_gain(rollouts, StubPolicy(policy, bump=0.0), task)
    assert check["solutions"] == 1
    assert abs(check["gain_per_solution"]) < 1e-5 and abs(check["gain_per_token"]) < 1e-6
    assert teacher_warning(check) is None


def test_a_teacher_that_reads_its_solution_gains_and_one_that_is_confused_is_warned(policy, batch):
    task, rollouts = batch
    assert teacher_gain(rollouts, StubPolicy(policy, bump=3.0), task)["gain_per_solution"] > 1.0
    confused = {"solutions": 3, "gain_per_solution": -26.0, "gain_per_token": -0.3, "teacher_logp_per_solution": -30.0,
                "student_logp_per_solution": -4.0, "kl_traces": 0, "kl_argmax_in_first_error": math.nan,
                "kl_argmax_uniform": math.nan}
    warning = teacher_warning(confused)
    assert warning is not None and "\n" not in warning and "26.0 nats lower" in warning
    assert warning in teacher_table(confused)


def test_kl_argmax_lands_in_the_first_wrong_step_when_the_teacher_reads_tau(policy, batch):
    task, rollouts = batch
    stub = StubPolicy(policy, bump=3.0)
    probe = Probe(stub, task, SamplingConfig(), torch.Generator().manual_seed(0))
    segment_ids = Probe(policy, task, SamplingConfig(), torch.Generator()).segment(rollouts, "lines")
    check = kl_argmax_hits(rollouts, segment_ids, FIRST, probe)
    assert check["kl_traces"] == 3 and check["kl_argmax_in_first_error"] == 1.0
    assert 0 < check["kl_argmax_uniform"] < 0.5
    blind = kl_argmax_hits(rollouts, segment_ids, FIRST, Probe(StubPolicy(policy, 0.0), task, SamplingConfig(),
                                                                 torch.Generator()))
    assert blind["kl_argmax_in_first_error"] == pytest.approx(1 / 3)  # KL 0 everywhere: argmax is token 0, step 1


def test_a_localiser_that_always_answers_step_1_scores_the_step1_share(policy, batch, monkeypatch):
    task, rollouts = batch
    monkeypatch.setitem(LOCALISERS._entries, "always_one",
                        Entry("always_one", lambda parents, options: [0] * len(parents.rows), None, "test"))
    segment_ids = Probe(policy, task, SamplingConfig(), torch.Generator()).segment(rollouts, "lines")
    values = [torch.tensor([0.5] * 5 + [float(r)]) for r in rollouts.rewards.tolist()]
    reference = MCValues(values, [torch.zeros(5, 2) for _ in values])
    config = AuditConfig(n=4, group_size=4, localisers=("always_one", "oracle"))
    out = audit_localisers(config, rollouts, segment_ids, reference, Labels(FIRST, FIRST, SLIPS), policy, task, False)
    one = out["localisers"]["always_one"]
    assert one["localisation_top1"] == pytest.approx(out["oracle_step1_share"]) == pytest.approx(1 / 3)
    assert one["step1_share"] == 1.0 and math.isnan(one["parse_rate"])
    assert out["localisers"]["oracle"]["localisation_top1"] == 1.0
    assert out["random_top1_expectation"] == pytest.approx(1 / 5)


def test_the_audit_hands_its_reply_limit_to_the_localiser(policy, batch, monkeypatch):
    task, rollouts = batch
    limits = []
    monkeypatch.setitem(LOCALISERS._entries, "records", Entry(
        "records", lambda parents, options: limits.append(options.prompt_max_new_tokens) or [0] * len(parents.rows),
        None, "test"))
    segment_ids = Probe(policy, task, SamplingConfig(), torch.Generator()).segment(rollouts, "lines")
    values = [torch.tensor([0.5] * 5 + [float(r)]) for r in rollouts.rewards.tolist()]
    reference = MCValues(values, [torch.zeros(5, 2) for _ in values])
    for config in (AuditConfig(n=4, group_size=4, localisers=("records",)),
                   AuditConfig(n=4, group_size=4, localisers=("records",), localiser_max_new_tokens=256)):
        audit_localisers(config, rollouts, segment_ids, reference, Labels(FIRST, FIRST, SLIPS), policy, task, False)
    assert limits == [4096, 256]  # SRPO's limit unless the audit caps it
    with pytest.raises(ConfigError, match="audit.localiser_max_new_tokens"):
        AuditConfig(localiser_max_new_tokens=0)


def test_parse_rate_counts_replies_the_parser_read():
    assert parse_figures({"parse_rules": ["prose", "fallback", "boxed", "prose"]})["parse_rate"] == 0.75
    figures = parse_figures({"resolved": "value"})
    assert math.isnan(figures["parse_rate"]) and figures["resolved"] == "value"


def test_self_asks_a_policy_that_can_read_the_request_and_values_otherwise(policy, batch):
    task, rollouts = batch
    tok = make_tokenizer(sft_config_for("arith-long-skilled"))
    reader = TinyPolicy.create(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, d_model=16, n_head=2, max_len=256), tok)
    for who, expected in ((reader, "prompt"), (policy, "value")):
        probe = Probe(who, task, SamplingConfig(max_new_tokens=8), torch.Generator().manual_seed(0))
        segment_ids = probe.segment(rollouts, "lines")
        notes: dict = {}
        picks = localise("self", rollouts, [1, 2], probe, segment_ids, random.Random(0), prompt_max_new_tokens=8,
                         notes=notes)
        assert notes["resolved"] == expected and len(picks) == 2
        assert (len(notes["parse_rules"]) == 2) if expected == "prompt" else "parse_rules" not in notes


def test_rredcot_with_the_reference_gets_its_twin_without_it():
    methods = [parse_method("rredcot"), parse_method("rredcot:candidates=answers"), parse_method("grpo")]
    twins = unprivileged_twins([(label, name, credit.get(name).make_config(options))
                                for label, name, options in methods])
    labels = [label for label, _, _ in twins]
    assert labels == ["rredcot", "rredcot:include_reference=false", "rredcot:candidates=answers", "grpo"]
    assert twins[1][2].include_reference is False and credit.get("rredcot").reads_privileged(twins[0][2])
    assert not credit.get("rredcot").reads_privileged(twins[1][2])
    already = [("a", "rredcot", twins[0][2]), ("b", "rredcot", twins[1][2])]
    assert unprivileged_twins(already) == already


def test_teacher_check_applies_to_sc_grpo_and_its_controls_only():
    sc = credit.get("shuffled").make_config({"of": "sc_grpo", "level": "token"})
    assert conditions_on_solution("sc_grpo", None) and conditions_on_solution("shuffled", sc)
    assert not conditions_on_solution("rredcot", None)
    assert not conditions_on_solution("shuffled", credit.get("shuffled").make_config({"of": "grpo"}))



def test_which_premises_a_compared_method_rests_on():
    from credo.lab.audit.premises import premises_of
    assert premises_of("sc_grpo") == (True, None) and premises_of("shuffled:of=sc_grpo:level=token") == (True, None)
    assert premises_of("srpo:localiser=prompt") == (False, "prompt") and premises_of("srpo") == (False, "self")
    assert premises_of("rrpo") == (False, None) and premises_of("rredcot") == (False, None)  # random; no teacher


def test_premises_measured_without_a_reference_score_the_oracle_perfectly_and_random_at_its_expectation():
    """On the shipped arith start's own traces: the oracle localiser names every labelled first wrong step (so
    the rows and their labels line up), on the same rows as every other localiser, with the same traces for the
    same seed."""
    from credo.lab.audit.premises import measure_premises
    from credo.train.sft import ensure_sft
    task = ArithTask()
    start = TinyPolicy.load(ensure_sft(progress=False))
    start.model.eval()
    sampling = SamplingConfig(1.0, 1.0, 48)
    out = measure_premises(start, task, task.heldout_problems(4), 8, sampling, 0, False, ["oracle", "random"])
    oracle, rand = out["localisers"]["oracle"], out["localisers"]["random"]
    assert out["traces"] == 32 and "teacher" not in out and 0 < oracle["traces"] <= 32 - round(32 * out["accuracy"])
    assert oracle["localisation_top1"] == 1.0 and oracle["step1_share"] == oracle["oracle_step1_share"]
    assert 0 < rand["random_top1_expectation"] < 1
    # as SRPO uses it: the oracle resets where the first errors lie, and is right on every kind of slip
    assert oracle["share_by_step"] == oracle["oracle_share_by_step"] == rand["oracle_share_by_step"]
    assert set(oracle["top1_by_slip"].values()) == {1.0} and sum(oracle["slip_counts"].values()) == oracle["traces"]
    assert rand["slip_counts"] == oracle["slip_counts"]
    with_teacher = measure_premises(start, task, task.heldout_problems(4), 8, sampling, 0, True, [])
    assert with_teacher["accuracy"] == out["accuracy"]  # the same traces: the seed fixes them
    assert with_teacher["teacher"]["solutions"] == round(32 * out["accuracy"])


def test_localisation_figures_are_nan_without_a_wrong_trace_and_a_localiser_that_cannot_run_is_reported(policy,
                                                                                                        batch):
    from credo.lab.audit.premises import localisation_figures
    task, rollouts = batch
    right = rollouts_of(policy, task, [RIGHT, RIGHT], CHAIN)
    probe = Probe(policy, task, SamplingConfig(), torch.Generator().manual_seed(0))
    out = localisation_figures(right, probe.segment(right, "lines"), [None, None], probe, ["prompt"], 0)
    assert out["prompt"]["traces"] == 0 and math.isnan(out["prompt"]["localisation_top1"])
    # this policy's alphabet lacks the request's letters: a failure row, not an exception
    out = localisation_figures(rollouts, probe.segment(rollouts, "lines"), FIRST, probe, ["prompt", "oracle"], 0)
    assert "the prompt localiser needs a policy that can read" in out["prompt"]["failure"]
    assert out["oracle"]["traces"] == 3 and out["oracle"]["localisation_top1"] == 1.0
