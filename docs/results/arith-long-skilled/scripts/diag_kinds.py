"""Per-kind teacher-forced loss (nats per solution) of the SFT examples, in the SFT's own batch format."""
import sys, random, torch
import torch.nn.functional as F
from credo.policy import load_policy
from credo.policy.base import right_pad
from credo.tasks.arith import ArithTask, PRESETS
from credo.sft import sft_example
torch.set_num_threads(1)
policy = load_policy(sys.argv[1]); policy.model.eval(); tok = policy.tokenizer
task = ArithTask(PRESETS["arith-long"], "arith-long")
problems = task.heldout_problems(32)
for kind in ("plain", "reference", "localise"):
    rows, starts = [], []
    for p in problems:
        c, t = sft_example(task, p, kind, random.Random(0))
        ci = tok.encode(c, bos=True); rows.append(ci + tok.encode(t, eos=True)); starts.append(len(ci))
    ids, mask = right_pad(rows, tok.pad_id)
    with torch.no_grad():
        logits = policy.model(ids[:, :-1])
    tgt = ids[:, 1:]
    pos = torch.arange(tgt.shape[1])[None]
    lm = mask[:, 1:] & (pos >= torch.tensor(starts)[:, None] - 1)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view(tgt.shape)
    print(kind, f"{float((nll * lm).sum(1).mean()):.2f} nats per example")
