"""credo's trainer vs TRL's GRPOTrainer: the same tiny HF model, prompts, group size, lengths and
optimiser schedule (one AdamW step per generated batch), both with GRPO advantages, timed in one run. Prints
credo's step time over TRL's (goal <= 0.5) and where credo's step time goes, phase by phase.
With `--lora R` both train the same LoRA adapters (rank R, alpha 16, every linear layer of the attention and the
MLP, no dropout: credo's `lora.*` settings, TRL's `peft_config`), and credo's full-weight step is timed in the same
run beside them.

Usage: python bench/vs_trl.py [--steps 4] [--model tiny|smollm2-135m] [--lora R]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from common import write  # noqa: E402
from trl_credo_grpo import tiny_model_and_tokenizer  # noqa: E402

LR = 1e-5
SIZES = {"tiny": (8, 4, 32), "smollm2-135m": (2, 4, 64)}  # prompts, completions each, max new tokens
PROMPTS, GROUP, LENGTH = SIZES["tiny"]


PHASES = ("collect", "prepare", "segment", "assign_credit", "update")  # TrainerStep.train_step's phases, in order


LORA_ALPHA = 16


def credo_step_seconds(model_dir: str, steps: int, lora_r: int = 0) -> tuple[float, dict[str, float]]:
    """(seconds per step, {phase: seconds per step}) of credo's trainer on TRL's schedule: one optimiser
    step per generated batch (epochs=1, minibatches=1, TRL's default steps_per_generation); LoRA adapters of
    rank `lora_r` when > 0."""
    from credo.train.plan import load_train_config
    from credo.train.trainer import Trainer
    lora = [f"lora.r={lora_r}", f"lora.alpha={LORA_ALPHA}", "lora.target_modules=all-linear"] if lora_r else []
    config = load_train_config(None, [f"start={model_dir}", "task=gym:chain_sum", f"prompts_per_step={PROMPTS}",
                                      f"group_size={GROUP}", f"sampling.max_new_tokens={LENGTH}", f"lr={LR}",
                                      "epochs=1", "minibatches=1", "beta2=0.999", "eval_n=1", "final_eval_n=0",
                                      # TRL's default optimiser (GRPOConfig.optim = adamw_torch_fused)
                                      "fused_adamw=true", *lora])
    spent = dict.fromkeys(PHASES, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(config, tmp, progress=False)
        for name in PHASES:  # time each phase where the trainer calls it
            def timed_phase(*args, _phase=getattr(trainer, name), _name=name):
                began = time.perf_counter()
                result = _phase(*args)
                spent[_name] += time.perf_counter() - began
                return result
            setattr(trainer, name, timed_phase)
        trainer.train_step()
        spent.update(dict.fromkeys(PHASES, 0.0))
        start = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        return (time.perf_counter() - start) / steps, {k: v / steps for k, v in spent.items()}


def trl_step_seconds(model_dir: str, steps: int, lora_r: int = 0) -> float:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from credo.tasks import make_task
    task = make_task("gym:chain_sum")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    # the prompt credo sends: with a chat template, the task's system prompt and the question as the user turn
    chat = bool(getattr(tokenizer, "chat_template", None))
    rows = [{"prompt": [{"role": "system", "content": task.system_prompt}, {"role": "user", "content": p.prompt}]
             if chat else p.prompt, "answer": p.answer}
             for p in task.train_problems(64, torch.Generator().manual_seed(0))]
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
                          max_completion_length=LENGTH, max_steps=steps + 1, learning_rate=LR,
                          report_to=[], use_cpu=True, bf16=False, save_strategy="no", logging_steps=1000)
        model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=False)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer,
                              reward_funcs=lambda completions, **kw: [float(len(c) % 2)
                                                                      for c in completions], args=args,
                              train_dataset=Dataset.from_list(rows), peft_config=peft_config(lora_r))
        times: list[float] = []
        from transformers import TrainerCallback

        class Clock(TrainerCallback):
            def on_step_begin(self, *a, **k):
                self.t = time.perf_counter()

            def on_step_end(self, *a, **k):
                times.append(time.perf_counter() - self.t)

        trainer.add_callback(Clock())
        trainer.train()
        return sum(times[1:]) / max(len(times) - 1, 1)


def peft_config(lora_r: int) -> object:
    """The peft LoraConfig TRL gets for credo's `lora.r=lora_r` settings (None: full weights)."""
    if not lora_r:
        return None
    from peft import LoraConfig
    return LoraConfig(r=lora_r, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--model", choices=tuple(SIZES), default="tiny",
                        help="tiny random Llama (8 x 4 completions of <= 32 tokens) or SmolLM2-135M-Instruct "
                             "(2 x 4 of <= 64, the sizes credo uses for it on a CPU)")
    parser.add_argument("--lora", type=int, default=0, metavar="R",
                        help="both train LoRA adapters of rank R (credo's full-weight step timed beside them)")
    args = parser.parse_args()
    global PROMPTS, GROUP, LENGTH
    PROMPTS, GROUP, LENGTH = SIZES[args.model]
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as scratch:
        if args.model == "tiny":
            model, tokenizer = tiny_model_and_tokenizer()
            model_dir = scratch
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
        else:
            from credo.policy.smollm import ensure_smollm2
            model_dir = ensure_smollm2()
        ours, phases = credo_step_seconds(model_dir, args.steps, args.lora)
        theirs = trl_step_seconds(model_dir, args.steps, args.lora)
        full = credo_step_seconds(model_dir, args.steps)[0] if args.lora else None
    adapter = f" (LoRA r={args.lora})" if args.lora else ""
    rows = [{"trainer": f"credo{adapter}", "seconds_per_step": ours, "ratio_to_trl": ours / theirs},
            {"trainer": f"trl GRPOTrainer{adapter}", "seconds_per_step": theirs, "ratio_to_trl": 1.0}]
    if full is not None:
        rows.append({"trainer": "credo (full weights)", "seconds_per_step": full, "ratio_to_trl": full / theirs})
    rows += [{"trainer": f"credo{adapter}: {name}", "seconds_per_step": seconds, "ratio_to_trl": seconds / theirs}
             for name, seconds in phases.items()]
    name = ("vs_trl" if args.model == "tiny" else f"vs_trl_{args.model.split('-')[0]}") + ("_lora" if args.lora else "")
    lora_note = (f" Both train LoRA adapters of rank {args.lora} (alpha {LORA_ALPHA}, every linear layer of the "
                 "attention and the MLP; TRL through peft_config); 'credo (full weights)' is credo's step without "
                 "them, timed in the same run." if args.lora else "")
    write(name, rows, f"{PROMPTS} prompts x {GROUP} completions, up to {LENGTH} new tokens, one optimiser step per "
          f"generated batch for both (credo: epochs=1, minibatches=1), {args.model} on CPU. credo's phases: collect = "
          "sampling + rewards, prepare = old log-probs (skipped on this on-policy schedule), assign_credit = GRPO "
          "advantages, update = forward + backward + AdamW." + lora_note)


if __name__ == "__main__":
    main()
