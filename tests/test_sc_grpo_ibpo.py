import torch

from credo import credit
from credo.credit.ibpo import edited_sets
from credo.credit.outcome import grpo_advantages
from credo.credit.sc_grpo import self_conditioned_kl, weight_from_divergence
from credo.policy.base import SamplingConfig
from credo.probe import Probe
from credo.rollouts import Rollouts
from credo.tasks.arith import ArithTask
from credo.tasks.base import Problem, rewards_for

P = Problem("37+48", "37+48\n", "85", {"terms": [37, 48], "ops": ["+"]})
RIGHT, WRONG = "37+48=85\n#### 85", "37+48=86\n#### 86"


def group_rollouts(policy, texts_by_group):
    task = ArithTask()
    texts = [t for grp in texts_by_group for t in grp]
    group = torch.tensor([g for g, grp in enumerate(texts_by_group) for _ in grp])
    problems = [P] * len(texts)
    prompt_ids, prompt_mask = policy.encode_prompts([P.prompt] * len(texts))
    ids, mask = policy.encode_completions(texts)
    rewards, correct = rewards_for(task, problems, texts)
    return Rollouts(prompt_ids, prompt_mask, ids, mask, group, rewards, torch.zeros(ids.shape), correct, problems, texts)


def probe(policy):
    return Probe(policy, ArithTask(), SamplingConfig(max_new_tokens=12), torch.Generator().manual_seed(0))


class Identity:
    """A task whose teacher context equals the student's prompt: KL must vanish."""

    def reference_prompt(self, problem, solution):
        return problem.prompt


def test_kl_is_zero_when_teacher_and_student_contexts_match(policy):
    r = group_rollouts(policy, [[RIGHT, WRONG]])
    pr = probe(policy)
    pr.task = Identity()
    D = self_conditioned_kl(r, pr, [0, 1], [1, 0], chunk_rows=1)
    assert D.abs().max() < 1e-5
    pr.task = ArithTask()
    D = self_conditioned_kl(r, pr, [0, 1], [1, 0], chunk_rows=2)
    assert (D[r.completion_mask] > 0).any() and (D[~r.completion_mask] == 0).all()
    f = weight_from_divergence(D, r.completion_mask, 0.75, 1e-4)
    assert (f >= 0).all() and (f < 1).all()


def test_sc_grpo_routing_branches(policy):
    G = 4
    mixed = [RIGHT, RIGHT, WRONG, WRONG]        # 2 <= n_c < G: weighted GRPO
    all_right = [RIGHT] * G                       # n_c = G: plain GRPO (zero advantage)
    one_right = [RIGHT, WRONG, WRONG, WRONG]      # n_c = 1: plain GRPO
    all_wrong = [WRONG, "37+48=87\n#### 87", "1", WRONG + "\n"]  # n_c = 0: diversity pseudo-advantage
    r = group_rollouts(policy, [mixed, all_right, one_right, all_wrong])
    out = credit.get("sc_grpo")(r, probe(policy))
    a = grpo_advantages(r.rewards, r.group)
    m = r.completion_mask
    w = out.weights
    assert ((w[:4][m[:4]] >= 0) & (w[:4][m[:4]] < 1)).all()  # mixed: f weights
    assert torch.allclose(out.advantages[:4], a[:4, None] * m[:4])
    assert (out.advantages[4:8] == 0).all() and (w[4:8][m[4:8]] == 1).all()
    assert torch.allclose(out.advantages[8:12], a[8:12, None] * m[8:12]) and (w[8:12][m[8:12]] == 1).all()
    seq = out.advantages[12:16].sum(1) / m[12:16].sum(1)
    assert seq.abs().max() <= 0.1 * 2 + 1e-6 and seq.abs().sum() > 0  # alpha-scaled z-scores
    assert abs(float(seq.sum())) < 1e-5
    assert (out.advantages[~m] == 0).all()
    assert out.cost.tokens_scored > 0


def test_edited_set_is_exactly_the_differing_span():
    e_w, e_c = edited_sets([1, 2, 3, 4, 5], [1, 2, 9, 4, 5])
    assert e_w == {2} and e_c == {2}
    e_w, e_c = edited_sets([1, 2, 3, 4, 5, 6], [1, 2, 5, 6])
    assert e_w == {2, 3} and e_c == set()
    e_w, e_c = edited_sets([1, 2, 5], [1, 2, 7, 8, 5])
    assert e_w == set() and e_c == {2, 3}


def test_ibpo_groups_without_both_outcomes_are_plain_grpo(policy):
    r = group_rollouts(policy, [[RIGHT, RIGHT, RIGHT], [WRONG, WRONG, "1"]])
    out = credit.get("ibpo")(r)
    grpo = credit.get("grpo")(r)
    assert torch.equal(out.advantages, grpo.advantages)


def test_ibpo_alignment_credit_and_mass_preservation(policy):
    r = group_rollouts(policy, [[RIGHT, WRONG, RIGHT]])
    a = grpo_advantages(r.rewards, r.group)
    out = credit.get("ibpo")(r)
    # WRONG differs from RIGHT at the last digit of the step result (position 7) and of the answer (15)
    row = out.advantages[1]
    full = [7, 15]
    assert torch.allclose(row[full], a[1].expand(2))
    others = [t for t in range(int(r.completion_mask[1].sum())) if t not in full]
    assert torch.allclose(row[others], 0.1 * a[1].expand(len(others)))
    spec = credit.get("ibpo")
    kept = spec(r, None, spec.make_config({"preserve_mass": True})).advantages
    n = r.completion_mask.sum(1).float()
    assert torch.allclose(kept.sum(1), a * n, atol=1e-5)
    assert (kept[~r.completion_mask] == 0).all()


def test_ibpo_correct_mode_reports_generation_and_falls_back(policy):
    r = group_rollouts(policy, [[RIGHT, WRONG, WRONG]])
    spec = credit.get("ibpo")
    out = spec(r, probe(policy), spec.make_config({"mode": "correct", "repair_tries": 2}))
    assert out.cost.tokens_generated > 0
    assert torch.isfinite(out.advantages).all() and (out.advantages[~r.completion_mask] == 0).all()
