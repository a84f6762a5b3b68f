"""Localisation replies of a tiny start: request lengths, replies batched vs one at a time (T = 0.3)."""
import sys, torch
from credo.policy import load_policy
from credo.core.protocols import SamplingConfig
from credo.tasks.arith import ArithTask, PRESETS
from credo.strategies.localisers import parse_step
torch.set_num_threads(1)
policy = load_policy(sys.argv[1]); policy.model.eval()
task = ArithTask(PRESETS["arith-long"], "arith-long")
problems = task.heldout_problems(40)
g = torch.Generator().manual_seed(0)
ids, mask = policy.encode_prompts([p.prompt for p in problems])
out = policy.sample(ids, mask, SamplingConfig(1.0, 1.0, 96), g)
texts = [policy.decode(r) for r in out.completion_ids]
wrong = [(p, t) for p, t in zip(problems, texts) if not task.is_correct(p, t)]
reqs, truths, ns = [], [], []
for p, t in wrong:
    lines = t.split("\n"); steps = [l + "\n" for l in lines[:-1]] + lines[-1:]
    reqs.append(task.localisation_prompt(p, steps)); ns.append(len(steps))
    truths.append(task.step_truth(p, t).first_error)
print("request lengths: max", max(map(len, reqs)), "mean", sum(map(len, reqs)) / len(reqs))
def ask(batch):
    i, m = policy.encode_prompts(batch, system=False)
    o = policy.sample(i, m, SamplingConfig(0.3, 1.0, 4096), torch.Generator().manual_seed(1))
    return [policy.decode(r) for r in o.completion_ids]
for label, replies in (("batched", ask(reqs)), ("alone", [ask([r])[0] for r in reqs])):
    parsed = [parse_step(r, n) for r, n in zip(replies, ns)]
    hit = sum(k == f for (k, _), f in zip(parsed, truths)) / len(reqs)
    rate = sum(rule != "fallback" for _, rule in parsed) / len(reqs)
    print(label, f"parse {rate:.2f} top1 {hit:.2f} step1 {sum(k == 0 for k, _ in parsed) / len(reqs):.2f}", replies[:6])
