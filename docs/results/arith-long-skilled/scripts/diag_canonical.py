"""Teacher vs student log p of canonical solutions of validation problems (SC-GRPO's teacher context with the
solution itself), and each of the first three solutions' worst tokens: python diag_canonical.py START."""
import sys, torch
from credo.policy import load_policy
from credo.tasks.arith import ArithTask, PRESETS
from credo.credit.sc_grpo import teacher_prompt
from credo.train.sft import validation_problems
torch.set_num_threads(1)
policy = load_policy(sys.argv[1]); policy.model.eval()
task = ArithTask(PRESETS["arith-long"], "arith-long")
problems = validation_problems(task, 24)
sols = [task.solution(p) for p in problems]
c_ids, c_mask = policy.encode_completions(sols)
t_ids, t_mask = policy.encode_prompts([teacher_prompt(task, policy, p, s, c_ids.shape[1], None, 0) for p, s in zip(problems, sols)])
s_ids, s_mask = policy.encode_prompts([p.prompt for p in problems])
with torch.no_grad():
    t, _ = policy.score(t_ids, t_mask, c_ids, c_mask)
    s, _ = policy.score(s_ids, s_mask, c_ids, c_mask)
print(f"teacher {t.sum(1).mean():.2f} student {s.sum(1).mean():.2f} gain {(t.sum(1)-s.sum(1)).mean():+.2f}")
d = (t - s)
# worst tokens
for b in range(3):
    n = int(c_mask[b].sum()); toks = policy.token_strings(c_ids[b, :n].tolist())
    worst = sorted(range(n), key=lambda i: float(d[b, i]))[:5]
    print(repr(sols[b][:60]), [(i, toks[i], round(float(t[b,i]),2), round(float(s[b,i]),2)) for i in worst])
# share of loss in last (eos) token
n = c_mask.sum(1) - 1
print("eos teacher", float(t[torch.arange(len(sols)), n].mean()), "student", float(s[torch.arange(len(sols)), n].mean()))
