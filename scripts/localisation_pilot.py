"""Can a small transformer learn SRPO's self-localisation when it is taught as a task of its own?

A learning curve, not a start: a tiny GPT from scratch is trained on localisation examples only (wrong traces
only: no `Step 0` target to settle on), the loss a per-example mean over the reply's tokens (nothing dilutes it),
at a constant learning rate, and scored every `--eval-every` steps on synthetic wrong traces of validation
problems built the way the training examples are (`credo.tasks.arith_skills.corrupted_lines`).

Two reply forms, on the same problems, seeds and schedule:
- `oneshot`: the task's own request (`ArithTask.localisation_prompt`, with its `Step i: ` prefixes), reply
  `Step k`, the form the `prompt` localiser reads today;
- `verdicts`: a compact request (the trace's lines without prefixes), reply one verdict per line up to the first
  wrong one (`1 ok`, `2 ok`, `3 wrong`) then `Step 3`, so that naming the step is a copy of a count the reply has
  already written, not a count done in one token.

Scored greedily (the reply the localiser would parse): parse rate (a `Step k` with 1 <= k <= K), first-error
top-1, top-1 split by the slip's kind (a wrong result, operand, carried value, or answer line) and by the first
error's position. Writes `curve.jsonl` (one row per evaluation) and `summary.json` under `--out`.

    python scripts/localisation_pilot.py --form verdicts --steps 2000 --out runs/loc-pilot/verdicts
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import time
from collections import Counter, defaultdict
from dataclasses import replace

import torch
import torch.nn.functional as F

from credo.policy.gpt import GPT, GPTConfig
from credo.policy.tokenizer import CharTokenizer
from credo.tasks import make_task
from credo.tasks.arith import ALPHABET, LOCALISATION_QUESTION, LOCALISATION_STEP, ArithTask
from credo.tasks.arith_skills import corrupted_lines
from credo.core.protocols import Problem

STEP_REPLY = re.compile(r"Step (\d+)\s*$")
EXTRA_CHARS = "".join(sorted(set(LOCALISATION_QUESTION + LOCALISATION_STEP + ": okwrong") - set(ALPHABET)))


def example(task: ArithTask, problem: Problem, rng: random.Random, form: str) -> tuple[str, str, int, str]:
    """(request, reply, first wrong step k (1-based), slip kind) of one wrong trace of `problem`."""
    truth = task.solution_lines(problem)
    line = rng.randrange(len(truth))
    lines = corrupted_lines(task, problem, line, rng)
    steps = [x + "\n" for x in lines[:-1]] + lines[-1:]
    k = task.step_truth(problem, "".join(steps)).first_error + 1
    kind = slip_kind(truth[k - 1], lines[k - 1])
    if form == "oneshot":
        return task.localisation_prompt(problem, steps), LOCALISATION_STEP.format(k), k, kind
    request = problem.prompt + "".join(x.strip() + "\n" for x in steps) + LOCALISATION_QUESTION + "\n"
    reply = "".join(f"{i} ok\n" for i in range(1, k)) + f"{k} wrong\n" + LOCALISATION_STEP.format(k)
    return request, reply, k, kind


def slip_kind(right: str, wrong: str) -> str:
    """Which part of the first wrong line differs from the worked solution's line."""
    if right.startswith("####"):
        return "answer"
    m_right, m_wrong = (re.match(r"(\d+)[+\-*](\d+)=(\d+)", x) for x in (right, wrong))
    if m_right.group(1) != m_wrong.group(1):
        return "carry"
    return "operand" if m_right.group(2) != m_wrong.group(2) else "result"


def batch(rows: list[tuple[list[int], int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x[B, L-1], y[B, L-1] (right-padded), w[B, L-1]: each example's reply tokens weighted 1/len(reply), so the
    loss is a per-example mean over replies."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    w = torch.zeros(len(rows), width - 1)
    for r, (row, start) in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row)
        w[r, start - 1:len(row) - 1] = 1.0 / (len(row) - start)
    return ids[:, :-1], ids[:, 1:], w


@torch.no_grad()
def greedy(model: GPT, tok: CharTokenizer, request: str, max_new: int) -> str:
    ids = tok.encode(request, bos=True)
    out: list[int] = []
    for _ in range(max_new):
        if len(ids) >= model.config.max_len:
            break
        nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
        if nxt == tok.eos_id:
            break
        ids.append(nxt)
        out.append(nxt)
    return "".join(tok.id_to_char.get(i, "") for i in out)


def evaluate(model: GPT, tok: CharTokenizer, evals: list[tuple[str, str, int, str, int]], max_new: int) -> dict:
    model.eval()
    hits, parsed = 0, 0
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_pos: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    picks: Counter = Counter()
    for request, _, k, kind, n_steps in evals:
        m = STEP_REPLY.search(greedy(model, tok, request, max_new))
        pick = int(m.group(1)) if m else None
        ok = pick is not None and 1 <= pick <= n_steps
        parsed += ok
        picks[pick if ok else "unparsed"] += 1
        hit = int(ok and pick == k)
        hits += hit
        for table, key in ((by_kind, kind), (by_pos, "first" if k == 1 else "last" if k == n_steps else "middle")):
            table[key][0] += hit
            table[key][1] += 1
    model.train()
    n = len(evals)
    return {"top1": hits / n, "parse_rate": parsed / n,
            "top1_by_kind": {key: round(h / c, 4) for key, (h, c) in sorted(by_kind.items())},
            "top1_by_position": {key: round(h / c, 4) for key, (h, c) in sorted(by_pos.items())},
            "pick_share": {str(key): round(c / n, 4) for key, c in sorted(picks.items(), key=str)}}


def uniform_top1(task: ArithTask, n: int, seed: int) -> float:
    """A uniform guess's top-1 on the evaluation traces of (task, n, seed): mean of 1 / (steps of the trace)."""
    rng = random.Random(1000 + seed)
    evals = [(p, example(task, p, rng, "oneshot")) for p in task.validation_problems(n)]
    return sum(1 / len(task.solution_lines(p)) for p, _ in evals) / len(evals)


def plot(runs: list[str], out: str, task: ArithTask, n: int, seed: int) -> None:
    """top-1 against examples seen, one line per run folder (its curve.jsonl), with the uniform guess on the
    evaluation traces of (task, n, seed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        rows = [json.loads(line) for line in open(os.path.join(run, "curve.jsonl"))]
        ax.plot([r["examples"] for r in rows], [r["top1"] for r in rows], marker="o", label=os.path.basename(run))
    ax.axhline(uniform_top1(task, n, seed), color="grey", linestyle="--", label="uniform guess")
    ax.set_xlabel("localisation examples seen (wrong traces only)")
    ax.set_ylabel("first-error top-1 (greedy, 200 validation traces)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata={"Software": None})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plot", nargs="+", metavar="RUN", help="plot these runs' curves into --out (a .png) and stop")
    ap.add_argument("--form", choices=("oneshot", "verdicts"), help="reply form (module docstring); required to train")
    ap.add_argument("--task", default="arith", help="arith (3-5 terms) or arith-long (8-12 terms)")
    ap.add_argument("--steps", type=int, default=2000, help="optimiser steps")
    ap.add_argument("--batch", type=int, default=64, help="examples per step (all wrong traces)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate, constant after 50 warm-up steps")
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks of the GPT trained from scratch")
    ap.add_argument("--width", type=int, default=128, help="residual width (4 heads)")
    ap.add_argument("--eval-every", type=int, default=250, help="steps between evaluations")
    ap.add_argument("--eval-n", type=int, default=200, help="validation wrong traces per evaluation")
    ap.add_argument("--init", default="", help="an SFT preset (e.g. arith) whose start the GPT begins from "
                    "(its shape; new characters get fresh embeddings) instead of random weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="new folder for curve.jsonl and summary.json")
    args = ap.parse_args()
    if args.plot:
        return plot(args.plot, args.out, make_task(args.task), args.eval_n, args.seed)
    if args.form is None:
        ap.error("--form is required to train")
    os.makedirs(args.out, exist_ok=False)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    task: ArithTask = make_task(args.task)
    start = None
    if args.init:
        from credo.policy.tiny import TinyPolicy
        from credo.train.sft import ensure_sft
        from credo.train.sft_config import sft_config_for
        start = TinyPolicy.load(ensure_sft(sft_config_for(args.init), progress=False))
    known = start.tokenizer.alphabet if start else ALPHABET
    tok = CharTokenizer(known + "".join(sorted(set(ALPHABET + EXTRA_CHARS) - set(known))))
    erng = random.Random(1000 + args.seed)
    evals = [example(task, p, erng, args.form) + (len(task.solution_lines(p)),)
             for p in task.validation_problems(args.eval_n)]
    longest = max(len(tok.encode(r + t, bos=True, eos=True)) for r, t, *_ in evals)
    if start is None:
        model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=args.layers, d_model=args.width, n_head=4,
                              max_len=max(64, longest + 16)))
    else:  # the start's shape; its rows first (every character it knows keeps its id), new characters fresh
        model = GPT(replace(start.model.config, vocab_size=tok.vocab_size))
        state = model.state_dict()
        for name, value in start.model.state_dict().items():
            state[name][:value.shape[0]] = value
        model.load_state_dict(state)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(args.seed)
    rng = random.Random(args.seed)
    max_new = max(len(t) for _, t, *_ in evals) + 4
    t0 = time.time()
    curve_path = os.path.join(args.out, "curve.jsonl")
    with open(curve_path, "w") as curve:
        def log(step: int, loss: float | None) -> dict:
            row = {"step": step, "examples": step * args.batch, "loss": loss,
                   "seconds": round(time.time() - t0, 1), **evaluate(model, tok, evals, max_new)}
            curve.write(json.dumps(row) + "\n")
            curve.flush()
            print(f"step {step:5d} examples {row['examples']:7d} loss {loss if loss is None else round(loss, 3)} "
                  f"top1 {row['top1']:.3f} parse {row['parse_rate']:.3f} {row['top1_by_kind']} {row['seconds']}s",
                  flush=True)
            return row
        row = log(0, None)
        running = None
        for step in range(1, args.steps + 1):
            rows = []
            for p in task.train_problems(args.batch, gen):
                request, reply, *_ = example(task, p, rng, args.form)
                a = tok.encode(request, bos=True)
                rows.append((a + tok.encode(reply, eos=True), len(a)))
            x, y, w = batch(rows, tok.pad_id)
            for g in opt.param_groups:
                g["lr"] = args.lr * min(1.0, step / 50)
            logits = model(x)
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
            loss = (nll * w.reshape(-1)).sum() / len(rows)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            value = float(loss.detach())
            running = value if running is None else 0.98 * running + 0.02 * value
            if step % args.eval_every == 0 or step == args.steps:
                row = log(step, running)
    uniform = uniform_top1(task, args.eval_n, args.seed)
    summary = {"form": args.form, "task": args.task, "config": vars(args), "uniform_top1": round(uniform, 4),
               "parameters": sum(p.numel() for p in model.parameters()), "final": row}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"done: top1 {row['top1']:.3f} (uniform {uniform:.3f}) parse {row['parse_rate']:.3f}")


if __name__ == "__main__":
    main()
