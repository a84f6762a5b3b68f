"""Teacher diagnostic: canonical solutions scored with and without themselves in context (SC-GRPO's format)."""
import sys, torch
from credo.policy import load_policy
from credo.tasks.arith import ArithTask, PRESETS
from credo.credit.sc_grpo import teacher_prompt
torch.set_num_threads(1)
policy = load_policy(sys.argv[1]); policy.model.eval()
task = ArithTask(PRESETS["arith-long"], "arith-long")
problems = task.heldout_problems(int(sys.argv[2]) if len(sys.argv) > 2 else 32)
sols = [task.solution(p) for p in problems]
c_ids, c_mask = policy.encode_completions(sols)
t_ids, t_mask = policy.encode_prompts([teacher_prompt(task, policy, p, s, c_ids.shape[1], None, 0) for p, s in zip(problems, sols)])
s_ids, s_mask = policy.encode_prompts([p.prompt for p in problems])
with torch.no_grad():
    t, _ = policy.score(t_ids, t_mask, c_ids, c_mask)
    s, _ = policy.score(s_ids, s_mask, c_ids, c_mask)
print(f"canonical: teacher {t.sum(1).mean():.2f} student {s.sum(1).mean():.2f} gain/solution {(t.sum(1)-s.sum(1)).mean():+.2f} "
      f"tokens {int(c_mask.sum())/len(sols):.1f}")
