"""Premise checks of SFT snapshots (`credo sft --snapshots DIR`) on the validation split of the training problems
(never the held-out set, so a start can be chosen by them): trace accuracy, the teacher check and the `prompt`
localiser, as `credo compare` measures them at the end of training (credo.lab.audit.premises.measure_premises).

    python snapshot_premises.py SNAPSHOTS_DIR OUT.jsonl [STEP ...]   # appends one JSON line per snapshot
"""

import json
import os
import sys

import torch

from credo.lab.audit.premises import measure_premises
from credo.core.protocols import SamplingConfig
from credo.policy.tiny import TinyPolicy
from credo.tasks.arith import PRESETS, ArithTask
from credo.train.sft import validation_problems

snapshots, out = sys.argv[1], sys.argv[2]
steps = sys.argv[3:] or sorted((d.split("-")[1] for d in os.listdir(snapshots) if d.startswith("step-")), key=int)
task = ArithTask(PRESETS["arith-long"], "arith-long")
problems = validation_problems(task, 8)  # 8 problems x 8 traces, the SFT's own validation problems
done = set()
if os.path.exists(out):
    done = {(json.loads(line)["snapshots"], json.loads(line)["step"]) for line in open(out)}
for step in steps:
    if (snapshots, int(step)) in done:
        continue
    policy = TinyPolicy.load(os.path.join(snapshots, f"step-{step}"))
    policy.model.eval()
    with torch.no_grad():
        result = measure_premises(policy, task, problems, 8, SamplingConfig(1.0, 1.0, 96), 0, True, ["prompt"])
    with open(out, "a") as f:
        f.write(json.dumps({"snapshots": snapshots, "step": int(step), **result}) + "\n")
    t, loc = result["teacher"], result["localisers"]["prompt"]
    print(f"step {step}: accuracy {result['accuracy']:.3f}, teacher gain {t['gain_per_solution']:+.1f} nats "
          f"({t['solutions']} solutions), KL argmax in first error {t['kl_argmax_in_first_error']:.3f} "
          f"(uniform {t['kl_argmax_uniform']:.3f}); prompt parse {loc.get('parse_rate', float('nan')):.2f}, "
          f"top-1 {loc.get('localisation_top1', float('nan')):.3f} "
          f"(uniform {loc.get('random_top1_expectation', 0):.3f}), "
          f"step-1 {loc.get('step1_share', float('nan')):.3f} (oracle {loc.get('oracle_step1_share', 0):.3f})",
          flush=True)
