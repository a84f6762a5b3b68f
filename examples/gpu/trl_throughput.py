"""TRL GRPOTrainer vs CreditGRPOTrainer on a GPU with vLLM generation: tokens/s and credo's credit overhead.

    python examples/gpu/trl_throughput.py --model Qwen/Qwen2.5-0.5B-Instruct --credit rredcot --steps 20
    python examples/gpu/trl_throughput.py --dry-run      # CPU: a tiny random Llama, 2 steps, no vLLM

Both trainers run the same model, data, batch and steps; with --use-vllm (the default on a GPU) TRL
samples with vLLM in colocate mode while the Probe scores with the training model (see
credo.integrations.trl). Printed, from one run of each: generated tokens/s, seconds per step, the step-time
ratio credo/TRL, and the share of credo's step spent in its credit step. Not run on the CPU machine this
repository is tested on beyond --dry-run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def model_and_tokenizer(args: argparse.Namespace):  # noqa: ANN201
    if args.dry_run:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
        from builders import build_tokenizer, tiny_llama
        tokenizer = build_tokenizer()
        return tiny_llama(tokenizer), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return (AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, trust_remote_code=False),
            AutoTokenizer.from_pretrained(args.model, trust_remote_code=False))


def run_one(args: argparse.Namespace, credit: str | None) -> dict[str, float]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from credo.integrations.trl import CreditGRPOTrainer
    from credo.tasks import make_task
    from credo.core.protocols import Problem
    task = make_task(args.task, json.loads(args.task_options))
    model, tokenizer = model_and_tokenizer(args)

    def reward(prompts, completions, answer, **kwargs):  # noqa: ANN001, ANN003, ANN202
        return [task.reward(Problem(key=q, prompt=q, answer=a), c if isinstance(c, str) else c[-1]["content"])
                for q, c, a in zip(prompts, completions, answer)]

    rows = [{"prompt": [{"role": "system", "content": task.system_prompt}, {"role": "user", "content": p.prompt}],
             "answer": p.answer}
             for p in task.train_problems(args.prompts * args.steps, torch.Generator().manual_seed(0))]
    gpu = torch.cuda.is_available() and not args.dry_run
    config = GRPOConfig(output_dir=os.path.join(args.out, credit or "trl"), per_device_train_batch_size=args.batch,
                        num_generations=args.group, max_completion_length=args.max_tokens, max_steps=args.steps,
                        logging_steps=1, report_to=[], use_cpu=not gpu, bf16=gpu, seed=0, save_strategy="no",
                        learning_rate=1e-6, use_vllm=gpu and args.use_vllm, vllm_mode="colocate")
    common = dict(model=model, processing_class=tokenizer, reward_funcs=reward, args=config,
                  train_dataset=Dataset.from_list(rows))
    trainer = CreditGRPOTrainer(**common, credit=credit, task=task) if credit else GRPOTrainer(**common)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    lengths = [row["completions/mean_length"] for row in trainer.state.log_history if "completions/mean_length" in row]
    generated = sum(lengths) * args.batch * trainer.accelerator.num_processes
    return {"seconds_per_step": seconds / args.steps, "generated_tokens_per_s": generated / seconds,
            "credit_seconds": getattr(trainer, "credit_seconds_total", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="HF model id or directory")
    parser.add_argument("--credit", default="rredcot", help="credo estimator for the CreditGRPOTrainer run")
    parser.add_argument("--task", default="gym:chain_sum", help="credo task")
    parser.add_argument("--task-options", default="{}", help="task options as JSON")
    parser.add_argument("--steps", type=int, default=20, help="optimiser steps per run")
    parser.add_argument("--batch", type=int, default=64, help="per-device batch (rows)")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (dataset size = prompts * steps)")
    parser.add_argument("--max-tokens", type=int, default=512, help="max completion tokens")
    parser.add_argument("--no-vllm", dest="use_vllm", action="store_false", help="generate with the training model")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU check: tiny random model, at most 2 steps, small batch")
    parser.add_argument("--out", default="runs/gpu-trl", help="output directory")
    args = parser.parse_args()
    if args.dry_run:
        args.steps, args.batch, args.group, args.prompts, args.max_tokens = min(args.steps, 2), 8, 4, 2, 16
    base = run_one(args, None)
    ours = run_one(args, args.credit)
    print(f"TRL GRPO:        {base['generated_tokens_per_s']:.1f} generated tokens/s, "
          f"{base['seconds_per_step']:.3f} s/step")
    print(f"credo {args.credit}: {ours['generated_tokens_per_s']:.1f} generated tokens/s, "
          f"{ours['seconds_per_step']:.3f} s/step")
    print(f"credit overhead: step time x{ours['seconds_per_step'] / base['seconds_per_step']:.2f} vs TRL; "
          f"credit step = {ours['credit_seconds'] / (ours['seconds_per_step'] * args.steps):.1%} of credo's run")


if __name__ == "__main__":
    main()
