"""How the value localiser's rule and `reset.value_drop` default were chosen, on TRAINING problems.

96 training problems x 2 samples from the shipped start (seed 123; never the audit's held-out problems); the
failed traces whose labelled first error is not their last segment are the parents. Each parent is valued
alone (suffix value: its own tail + the reference tail, as `localise_by_value` does) and localised by "the
first transition whose drop exceeds a threshold" (final transition excluded; step 1 if none), with the drop
taken linearly or as a log ratio, on the absolute and the normalized value. Printed: localisation top-1 and
the share of step-1 picks (the oracle's share is printed first).
Usage: CREDO_CACHE=... python docs/results/audit-faithful/choose_value_drop.py > choose_value_drop.txt
"""
import torch

from credo.credit.values import suffix_values
from credo.policy import load_policy
from credo.core.protocols import SamplingConfig
from credo.probe import Probe
from credo.segment import segment_bounds
from credo.sft import ensure_sft
from credo.strategies import sample_groups
from credo.tasks import make_task

torch.set_num_threads(1)
task = make_task("arith", {})
policy = load_policy(ensure_sft(progress=False))
policy.model.eval()
generator = torch.Generator().manual_seed(123)
sampling = SamplingConfig(1.0, 1.0, 96)
rollouts = sample_groups(policy, task, task.train_problems(96, generator), 2, sampling, generator)
probe = Probe(policy, task, sampling, torch.Generator().manual_seed(1))
seg = probe.segment(rollouts, "lines")
n_segments = [len(b) for b in segment_bounds(seg)]
first = {i: task.step_truth(rollouts.problems[i], rollouts.completions[i]).first_error
         for i in range(rollouts.batch_size) if not bool(rollouts.correct[i])}
rows = [i for i, f in first.items() if f is not None and f < n_segments[i] - 1]
print(f"parents {len(rows)}; oracle step-1 share {sum(first[i] == 0 for i in rows) / len(rows):.3f}")
alone = rollouts.select(rows).with_fields(group=torch.arange(len(rows)))
has_answer = [task.extract_answer(t) is not None for t in alone.completions]
for mode in ("absolute", "normalized"):
    values = suffix_values(alone, probe, seg[rows], mode, True)
    for kind, thresholds in (("linear", (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)), ("log", (0.5, 1.0, 2.0, 4.0, 6.0))):
        for threshold in thresholds:
            hits = step1 = 0
            for i, v, answered in zip(rows, values, has_answer):
                a, b = v[:-2], v[1:-1]
                drop = a - b if kind == "linear" else a.clamp(min=1e-30).log() - b.clamp(min=1e-30).log()
                found = (drop > threshold).nonzero().flatten().tolist()
                k = found[0] if found and answered else 0
                hits += k == first[i]
                step1 += k == 0
            print(f"{mode:10s} {kind:6s} threshold={threshold:<6} top1={hits / len(rows):.3f} "
                  f"step1_share={step1 / len(rows):.3f}")
