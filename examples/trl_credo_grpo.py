"""Train with TRL's GRPOTrainer, credo's RREDCoT credit instead of uniform GRPO advantages.

    python examples/trl_credo_grpo.py                      # a tiny random Llama, 2 steps, CPU, ~20 s
    python examples/trl_credo_grpo.py --model smollm2-135m --steps 5   # the real model (~30 s a step on CPU)

Task: reasoning-gym chain_sum; reward: its verifier on the <answer>...</answer> span.
"""

from __future__ import annotations

import argparse

import torch
from datasets import Dataset
from trl import GRPOConfig

from credo.integrations.trl import CreditGRPOTrainer
from credo.tasks import make_task
from credo.core.protocols import Problem


def tiny_model_and_tokenizer():
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["State the final answer: 4 - 1 - 7 = <answer>-4</answer>"] * 10,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<pad>", "<eos>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64,
                                      intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="'' (tiny random Llama), smollm2-135m, or an HF model directory")
    parser.add_argument("--credit", default="rredcot", help="any credo estimator (credo methods)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default="runs/trl-example")
    args = parser.parse_args()
    task = make_task("gym:chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2})
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from credo.policy.smollm import ALIASES, ensure_smollm2
        path = ensure_smollm2() if args.model in ALIASES else args.model
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    else:
        model, tokenizer = tiny_model_and_tokenizer()

    def reward(prompts, completions, answer, **kwargs):  # TRL passes dataset columns by name
        return [task.reward(Problem(key=q, prompt=q, answer=a), c) for c, q, a in zip(completions, prompts, answer)]

    rows = [{"prompt": task.system_prompt + "\n\n" + p.prompt, "answer": p.answer}
            for p in task.train_problems(64, torch.Generator().manual_seed(0))]
    config = GRPOConfig(output_dir=args.out, per_device_train_batch_size=8, num_generations=4, max_completion_length=32,
                        max_steps=args.steps, logging_steps=1, report_to=[], use_cpu=True,
                        bf16=False, save_strategy="no", learning_rate=1e-5)
    trainer = CreditGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward, args=config,
                                train_dataset=Dataset.from_list(rows), credit=args.credit, task=task)
    trainer.train()
    print("credo credit cost:", trainer.credit_cost_total)


if __name__ == "__main__":
    main()
