"""How RREDCoT's default lam / centring / uniform-group handling were chosen.

On the audit batch (the shipped start, 256 traces, the cached K_ref=32 reference of
`credo audit --n 256 --k-ref 32`), the default suffix value is computed once and every combination
of lam in {0.25, 0.5, 1}, center, skip_uniform_groups is turned into advantages. Printed per
combination (segment advantages = mean over a segment's tokens):
  sign_agreement         share of labelled steps whose advantage has the step's sign: segments of
                         correct traces >= 0, correct steps before the first error of a wrong trace
                         >= 0, the first wrong step < 0 (pooled);
  correct_negative       share of correct traces' segments with a negative advantage;
  pre_error_positive     share of correct steps before the first error (wrong traces) with A > 0;
  first_error_negative   share of first wrong steps with A < 0;
  allwrong_abs           mean |A| per token in all-wrong groups (GRPO: 0);
  last_step_gap          correct traces: last step line's advantage minus the earlier lines' mean.
And, for the value's own redistribution R, first-error top-1 / pairwise in all-wrong vs mixed groups.
Usage: CREDO_CACHE=... python docs/results/audit-faithful/choose_lam.py > choose_lam.txt
"""
import torch

from credo.audit import AuditConfig, build_reference, first_error_top1, pairwise_rank
from credo.credit.outcome import group_mean_std
from credo.credit.rredcot import RREDCoTConfig, advantages_from_redistribution, probe_values, redistribute
from credo.policy import load_policy
from credo.core.protocols import SamplingConfig
from credo.probe import Probe
from credo.segment import segment_means
from credo.sft import ensure_sft
from credo.tasks import make_task

torch.set_num_threads(1)
checkpoint = ensure_sft(progress=False)
data = build_reference(AuditConfig(checkpoint=checkpoint, n=256, k_ref=32, methods=()), checkpoint, progress=False)
task = make_task("arith", {})
policy = load_policy(checkpoint)
policy.model.eval()
rollouts, seg = data.rollouts, data.segment_ids
probe = Probe(policy, task, SamplingConfig(1.0, 1.0, 96), torch.Generator().manual_seed(2))
R = redistribute(probe_values(rollouts, probe, seg, RREDCoTConfig()))
first = [None if bool(ok) else task.step_truth(p, t).first_error
         for p, t, ok in zip(rollouts.problems, rollouts.completions, rollouts.correct)]
mean, sd = group_mean_std(rollouts.rewards, rollouts.group)
all_wrong = [float(s) < 1e-8 and float(m) == 0 for s, m in zip(sd, mean)]
mixed = [float(s) > 1e-8 for s in sd]


def only(keep):
    return [f if k else None for f, k in zip(first, keep)]


print(f"value credit R: top1 all-wrong groups {first_error_top1(R, only(all_wrong)):.3f}, mixed "
      f"{first_error_top1(R, only(mixed)):.3f}; pairwise all-wrong {pairwise_rank(R, only(all_wrong)):.3f}, "
      f"mixed {pairwise_rank(R, only(mixed)):.3f}")
for lam in (0.25, 0.5, 1.0):
    for center in (True, False):
        for skip in (False, True):
            adv, _ = advantages_from_redistribution(rollouts, seg, R, RREDCoTConfig(lam=lam, center=center,
                                                                                     skip_uniform_groups=skip))
            segs = segment_means(adv, seg)
            correct = [float(a) >= -1e-6 for c, ok in zip(segs, rollouts.correct) if ok for a in c]
            pre = [float(c[j]) > 1e-6 for c, f in zip(segs, first) if f is not None and f < len(c) for j in range(f)]
            at = [float(c[f]) < -1e-6 for c, f in zip(segs, first) if f is not None and f < len(c)]
            agree = (sum(correct) + sum(pre) + sum(at)) / (len(correct) + len(pre) + len(at))
            aw = [float(a[m].abs().mean()) for a, m, w in zip(adv, rollouts.completion_mask, all_wrong) if w]
            gap = [float(c[-2] - c[:-2].mean()) for c, ok in zip(segs, rollouts.correct) if ok and len(c) > 2]
            print(f"lam={lam} center={center} skip_uniform_groups={skip}: sign_agreement={agree:.3f} "
                  f"correct_negative={1 - sum(correct) / len(correct):.3f} pre_error_positive={sum(pre) / len(pre):.3f} "
                  f"first_error_negative={sum(at) / len(at):.3f} allwrong_abs={sum(aw) / len(aw):.3f} "
                  f"last_step_gap={sum(gap) / len(gap):.3f}")
