import torch

from builders import ADDITION, probe_for
from credo import credit
from credo.credit.ibpo import edited_sets
from credo.core.groups import grpo_advantages
from credo.credit.sc_grpo import self_conditioned_kl, weight_from_divergence
from credo.core.rollouts import Rollouts
from credo.tasks.arith import ArithTask
from credo.core.protocols import Problem, rewards_for

P = ADDITION
RIGHT, WRONG = "37+48=85\n#### 85", "37+48=86\n#### 86"


def group_rollouts(policy, texts_by_group, problem=P):
    task = ArithTask()
    texts = [t for grp in texts_by_group for t in grp]
    group = torch.tensor([g for g, grp in enumerate(texts_by_group) for _ in grp])
    problems = [problem] * len(texts)
    prompt_ids, prompt_mask = policy.encode_prompts([problem.prompt] * len(texts))
    ids, mask = policy.encode_completions(texts)
    rewards, correct = rewards_for(task, problems, texts)
    return Rollouts(prompt_ids, prompt_mask, ids, mask, group, rewards, torch.zeros(ids.shape),
                    correct, problems, texts)


class Identity:
    """A task whose teacher context equals the student's prompt: KL must vanish."""

    def reference_prompt(self, problem, solution):
        return problem.prompt


def test_kl_is_zero_when_teacher_and_student_contexts_match(policy):
    r = group_rollouts(policy, [[RIGHT, WRONG]])
    pr = probe_for(policy, ArithTask())
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
    all_wrong = [WRONG, "1+2=3\n#### 3", "9", "50-1=49\n#### 49"]  # n_c = 0: diversity pseudo-advantage
    r = group_rollouts(policy, [mixed, all_right, one_right, all_wrong])
    out = credit.get("sc_grpo")(r, probe_for(policy, ArithTask()))
    a = grpo_advantages(r.rewards, r.group)
    m = r.completion_mask
    w = out.weights
    n = m[:4].sum(1).float()
    assert torch.allclose((w[:4] * m[:4]).sum(1) / n, torch.ones(4), atol=1e-5)  # mixed: f, mean 1 per sequence
    assert (w[:4][m[:4]] >= 0).all() and (w[:4][m[:4]] > 1).any()
    assert torch.allclose(out.advantages[:4], a[:4, None] * m[:4])
    assert (out.advantages[4:8] == 0).all() and (w[4:8][m[4:8]] == 1).all()
    assert torch.allclose(out.advantages[8:12], a[8:12, None] * m[8:12]) and (w[8:12][m[8:12]] == 1).all()
    seq = out.advantages[12:16].sum(1) / m[12:16].sum(1)
    reference = [i for i in range(4) if (out.advantages[12 + i] == 0).all()]
    assert len(reference) == 1  # n_c = 0: the reference rollout sits out of its own z-score...
    others = seq[[i for i in range(4) if i != reference[0]]]
    assert abs(float(others.sum())) < 1e-5  # ...the others are z-scored among themselves
    assert others.abs().max() <= 0.1 * 2 / 3 ** 0.5 + 1e-6 and others.abs().sum() > 0  # alpha-scaled z of 3
    assert (out.advantages[~m] == 0).all()
    assert out.cost.tokens_scored > 0
    spec = credit.get("sc_grpo")
    # the paper's f in [0, 1)
    raw = spec(r, probe_for(policy, ArithTask()), spec.make_config({"normalise": False})).weights
    assert ((raw[:4][m[:4]] >= 0) & (raw[:4][m[:4]] < 1)).all()
    assert torch.allclose(w[:4], raw[:4] / ((raw[:4] * m[:4]).sum(1, keepdim=True) / n[:, None]) * m[:4], atol=1e-5)


def test_sc_grpo_draws_new_references_every_step_and_repeats_with_the_seed(policy):
    rights = ["37+48=85\n####" + " " * k + "85" for k in range(6)]  # six distinct correct texts
    r = group_rollouts(policy, [rights + [WRONG, WRONG]])
    spec = credit.get("sc_grpo")
    shared = probe_for(policy, ArithTask())
    first, second = spec(r, shared).weights, spec(r, shared).weights  # two steps of one run
    assert not torch.equal(first, second)
    # a fresh run with the same seed repeats step 1
    assert torch.equal(spec(r, probe_for(policy, ArithTask())).weights, first)


def test_sc_grpo_traces_longer_than_half_the_context_truncate_the_teacher_reference(policy):
    from credo.credit.sc_grpo import context_length, teacher_prompt
    long_right, long_wrong = "1+1=2\n" * 12 + "#### 85", "1+1=2\n" * 12 + "#### 86"
    limit = context_length(policy)
    r = group_rollouts(policy, [[long_right, long_right, long_wrong, long_wrong]])
    T = r.completion_ids.shape[1]
    assert T > limit // 2  # tau + prompt + completion cannot fit: this used to fail in the forward pass
    out = credit.get("sc_grpo")(r, probe_for(policy, ArithTask()))
    assert out.info["teacher_truncated_rows"] == 4 and torch.isfinite(out.weights).all()
    task, cut = ArithTask(), []
    text = teacher_prompt(task, policy, P, long_right, T, cut, 0)
    head, _, prompt = text.partition("|")
    assert prompt == P.prompt and long_right.startswith(head) and 0 < len(head) < len(long_right) and cut == [0]
    assert int(policy.encode_prompts([text])[1].sum()) + T <= limit
    assert teacher_prompt(task, policy, P, RIGHT, 20, cut, 1) == task.reference_prompt(P, RIGHT) and cut == [0]


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


def test_ibpo_all_regions_ablation_credit_and_mass_preservation(policy):
    r = group_rollouts(policy, [[RIGHT, WRONG, RIGHT]])
    a = grpo_advantages(r.rewards, r.group)
    spec = credit.get("ibpo")
    out = spec(r, None, spec.make_config({"regions": "all", "kappa": 0.1}))  # the paper's raw totals (default)
    # WRONG differs from RIGHT at the last digit of the step result (position 7) and of the answer (15)
    row = out.advantages[1]
    full = [7, 15]
    assert torch.allclose(row[full], a[1].expand(2))
    others = [t for t in range(int(r.completion_mask[1].sum())) if t not in full]
    assert torch.allclose(row[others], 0.1 * a[1].expand(len(others)))
    kept = spec(r, None, spec.make_config({"regions": "all", "kappa": 0.1, "preserve_mass": True})).advantages
    n = r.completion_mask.sum(1).float()
    assert torch.allclose(kept.sum(1), a * n, atol=1e-5)
    assert (kept[~r.completion_mask] == 0).all()


CARRIED = (Problem("37+48-12", "37+48-12\n", "73", {"terms": [37, 48, 12], "ops": ["+", "-"]}),
           "37+48=85\n85-12=73\n#### 73",   # correct
           "37+48=86\n86-12=74\n#### 74")   # one wrong line, then its value carried forward correctly


def test_ibpo_credits_only_the_wrong_line_not_the_lines_that_carry_it_forward(policy):
    problem, right, wrong = CARRIED
    task = ArithTask()
    assert task.step_truth(problem, wrong).first_error == 0  # later lines are correct given line 1
    r = group_rollouts(policy, [[right, wrong, right, wrong]], problem)
    a = grpo_advantages(r.rewards, r.group)
    spec = credit.get("ibpo")
    plain = spec(r, None, spec.make_config({})).advantages  # defaults: first region, kappa 0, raw totals
    first_line = set(range(len("37+48=86\n")))
    for row in (1, 3):   # each wrong trace: the differing digit of its first line only, at full A_w
        credited = set(plain[row].nonzero().flatten().tolist())
        assert credited == {7} and credited <= first_line and torch.isclose(plain[row, 7], a[row])
    assert set(plain[0].nonzero().flatten().tolist()) == {7}  # c*: the counterpart ("5" of "=85")
    assert (plain[2] != 0).sum() == int(r.completion_mask[2].sum())  # a correct trace nobody chose: GRPO
    out = spec(r, None, spec.make_config({"preserve_mass": True})).advantages  # first region, mass kept
    n = r.completion_mask.sum(1).float()
    assert torch.allclose(out.sum(1), a * n, atol=1e-5)
    assert set(out[1].nonzero().flatten().tolist()) == {7}
    every = spec(r, None, spec.make_config({"regions": "all"})).advantages
    assert len(set(every[1].nonzero().flatten().tolist())) > 1  # the ablation credits the carried lines too


def test_first_edit_of_an_insertion_or_deletion_is_the_divergence_token():
    from credo.credit.ibpo import first_edit
    assert first_edit([1, 2, 3, 4, 9], [1, 2, 7, 4, 8]) == ({2}, {2})
    assert first_edit([1, 2, 5], [1, 2, 7, 8, 5]) == ({2}, {2, 3})  # w wrote 5 where c* inserted 7 8
    assert first_edit([1, 2, 3, 4, 5, 6], [1, 2, 5, 6]) == ({2, 3}, {2})
    assert first_edit([1, 2], [1, 2, 3]) == (set(), {2})  # w stops early: no token of w to credit


def test_ibpo_correct_mode_reports_generation_and_falls_back(policy):
    r = group_rollouts(policy, [[RIGHT, WRONG, WRONG]])
    spec = credit.get("ibpo")
    out = spec(r, probe_for(policy, ArithTask()), spec.make_config({"mode": "correct", "repair_tries": 2}))
    assert out.cost.tokens_generated > 0
    assert torch.isfinite(out.advantages).all() and (out.advantages[~r.completion_mask] == 0).all()


def test_sc_grpo_diversity_scores_equal_up_to_float_noise_give_no_advantage():
    from credo.credit.sc_grpo import _diversity_advantages
    f = torch.tensor([[0.4180, 0.4306, 0.2899]] * 3)  # three others, identical over the reference's length
    advantages, mask = torch.ones(4, 3), torch.ones(4, 3, dtype=torch.bool)
    _diversity_advantages(advantages, f, [([0, 1, 3], 2)], torch.tensor([3, 3, 2, 3]), mask, 0.1)
    assert (advantages == 0).all()
    f[2, 0] = 0.9  # one other differs: z-scores among the three, the reference at 0
    _diversity_advantages(advantages, f, [([0, 1, 3], 2)], torch.tensor([3, 3, 2, 3]), mask, 0.1)
    assert (abs(float(advantages[[0, 1, 3], 0].sum())) < 1e-6 and float(advantages[3, 0]) > 0
            and (advantages[2] == 0).all())


def test_sc_grpo_single_correct_weights_the_wrong_members_with_the_lone_solution_as_teacher(policy):
    """With single_correct an n_c = 1 group's wrong members get token weights f (mean 1 per sequence) from a
    teacher that reads the lone correct rollout; the correct one keeps weight 1, and every advantage stays
    GRPO's. Off (the default) the group is plain GRPO, as the routing test above checks."""
    from credo.credit.sc_grpo import weighted_group_rows
    one_right = [RIGHT, WRONG, "37+48=84\n#### 84", "37+40=77\n#### 77"]
    mixed = [RIGHT, RIGHT, WRONG, WRONG]
    r = group_rollouts(policy, [one_right, mixed])
    spec = credit.get("sc_grpo")
    on = spec(r, probe_for(policy, ArithTask()), spec.make_config({"single_correct": True}))
    off = spec(r, probe_for(policy, ArithTask()))
    m = r.completion_mask
    a = grpo_advantages(r.rewards, r.group)
    assert torch.allclose(on.advantages, a[:, None] * m) and torch.allclose(off.advantages, a[:, None] * m)
    assert (on.weights[0][m[0]] == 1).all() and (off.weights[:4][m[:4]] == 1).all()
    wrong = on.weights[1:4]
    assert torch.allclose((wrong * m[1:4]).sum(1) / m[1:4].sum(1), torch.ones(3), atol=1e-5)
    assert (wrong[m[1:4]] != 1).any()  # the teacher's divergence moved them off uniform
    assert on.info["weighted_rows"] == off.info["weighted_rows"] + 3
    assert weighted_group_rows(r) == [4, 5, 6, 7]
    assert weighted_group_rows(r, single_correct=True) == [1, 2, 3, 4, 5, 6, 7]
