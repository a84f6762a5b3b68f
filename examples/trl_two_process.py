"""CreditGRPOTrainer on several processes gives what it gives on one: same rollouts, same advantages, same update.

    accelerate launch --multi_gpu --num_processes 2 examples/trl_two_process.py --out runs/trl-2p  # CPU: gloo
    accelerate launch --num_processes 1 examples/trl_two_process.py --out runs/trl-1p --per-device 8
    python examples/trl_two_process.py --compare runs/trl-1p runs/trl-2p

Generation randomness is taken out through TRL's rollout hook (`rollout_func`): every row of the global
batch gets a fixed completion chosen by its position in its group, so both layouts train on the same 8 rows
(2 prompts x 4 completions; one group per process with 2 processes). For each estimator (--credit) one
optimiser step runs from the same tiny random Llama; rank 0 writes the per-row advantages (gathered from
all processes) and the updated weights to --out/<credit>.{json,safetensors}.

--deal-split plants the fault credo's groups_whole check is there for: the generation batch is dealt out of group
order (prompt indices 0 0 1 1 | 0 0 1 1), so each process holds half of both groups; credo's credit checks stop
the run before the update, naming the check, the row and the step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def fixed_completions(answer: str) -> list[str]:
    return [f"Let me add. So it is {answer}. <answer>{answer}</answer>", "Wait. <answer>0</answer>",
            f"Therefore\n\n<answer>{answer}</answer>", "no idea"]


class SplitGroupSampler:
    """Prompt indices 0 0 1 1 per process batch: every group of 4 split across two processes' batches."""

    def __iter__(self):  # noqa: ANN204
        return iter([0, 0, 1, 1] * 64)

    def __len__(self) -> int:
        return 256


def build(per_device: int, credit: str, out: str, deal_split: bool = False):  # noqa: ANN201
    import datasets
    from trl import GRPOConfig
    from builders import build_tokenizer, tiny_llama

    from credo.integrations.trl import CreditGRPOTrainer
    from credo.tasks import make_task
    from credo.core.protocols import Problem
    tokenizer = build_tokenizer()
    task = make_task("gym:chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    problems = task.heldout_problems(2)
    answers = {p.prompt: p.answer for p in problems}
    model = tiny_llama(tokenizer, max_positions=256, init_range=0.5)

    def rollout(prompts: list, trainer) -> dict:  # noqa: ANN001
        # this process's rows of the generation batch (each prompt num_generations times in a row): the
        # completion is chosen by the row's global position within its group
        first = trainer.accelerator.process_index * len(prompts)
        texts = [fixed_completions(answers[p])[(first + j) % 4] for j, p in enumerate(prompts)]
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completion_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": [[0.0] * len(c) for c in completion_ids]}

    def reward(prompts, completions, answer, **kwargs):  # noqa: ANN001, ANN003, ANN202
        return [task.reward(Problem(key=q, prompt=q, answer=a), c) for q, c, a in zip(prompts, completions, answer)]

    args = GRPOConfig(output_dir=os.path.join(out, credit), per_device_train_batch_size=per_device, num_generations=4,
                      max_completion_length=24, max_steps=1, logging_steps=1, report_to=[], use_cpu=True, bf16=False,
                      seed=0, save_strategy="no", learning_rate=1e-2, beta=0.0, shuffle_dataset=False)
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in problems]
    trainer = CreditGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward, args=args,
                                train_dataset=datasets.Dataset.from_list(rows), credit=credit, task=task,
                                rollout_func=rollout)
    if deal_split:
        trainer._get_train_sampler = lambda dataset=None: SplitGroupSampler()
    return trainer


def run(per_device: int, credit: str, out: str, deal_split: bool = False) -> None:
    from accelerate.utils import gather_object
    from safetensors.torch import save_file
    trainer = build(per_device, credit, out, deal_split)
    seen: list = []
    original = trainer._generate_and_score_completions

    def spy(inputs):  # noqa: ANN001, ANN202
        output = original(inputs)
        mask = output["completion_mask"].bool()
        rows = [[round(float(v), 7) for v in a[m]] for a, m in zip(output["advantages"].cpu(), mask.cpu())]
        seen.extend(gather_object(rows))  # gather_for_metrics would drop rows past the dataset's length
        return output

    trainer._generate_and_score_completions = spy
    initial = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    if trainer.accelerator.is_main_process:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{credit}.json"), "w") as f:
            json.dump({"advantages": seen, "processes": trainer.accelerator.num_processes}, f)
        model = trainer.accelerator.unwrap_model(trainer.model)
        after = model.state_dict()
        save_file({k: v.detach().cpu().contiguous() for k, v in after.items()},
                  os.path.join(out, f"{credit}.safetensors"))
        save_file({k: (after[k].detach().cpu() - initial[k].cpu()).contiguous() for k in after},
                  os.path.join(out, f"{credit}.update.safetensors"))


def compare(a: str, b: str, credits: list[str]) -> dict[str, dict[str, float]]:
    """Max |difference| of advantages and of updated weights between two runs' outputs, per estimator."""
    from safetensors.torch import load_file
    out = {}
    for credit in credits:
        ra, rb = (json.load(open(os.path.join(d, f"{credit}.json"))) for d in (a, b))
        adv = max(abs(x - y) for ra_row, rb_row in zip(ra["advantages"], rb["advantages"])
                  for x, y in zip(ra_row, rb_row))
        same_shape = [len(r) for r in ra["advantages"]] == [len(r) for r in rb["advantages"]]
        wa, wb = (load_file(os.path.join(d, f"{credit}.safetensors")) for d in (a, b))
        ua, ub = (load_file(os.path.join(d, f"{credit}.update.safetensors")) for d in (a, b))
        weights = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        relative = float(sum(((ua[k] - ub[k]) ** 2).sum()
                             for k in ua) ** 0.5 / sum((ua[k] ** 2).sum() for k in ua) ** 0.5)
        out[credit] = {"advantages_max_abs_diff": adv if same_shape else float("inf"), "weights_max_abs_diff": weights,
                       "update_max_abs": max(float(ua[k].abs().max()) for k in ua), "update_relative_l2_diff": relative,
                       "max_abs_advantage": max(abs(x) for r in ra["advantages"] for x in r)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/trl-two-process", help="output directory")
    parser.add_argument("--per-device", type=int, default=4, help="rows per process (8 / number of processes)")
    parser.add_argument("--credit", nargs="+", default=["rredcot", "sc_grpo"], help="credo estimators to run")
    parser.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="print the differences of two runs")
    parser.add_argument("--deal-split", action="store_true", help="plant a group split across processes (see above)")
    args = parser.parse_args()
    if args.compare:
        print(json.dumps(compare(*args.compare, args.credit), indent=2))
        return
    torch.set_num_threads(1)
    for credit in args.credit:
        run(args.per_device, credit, args.out, args.deal_split)


if __name__ == "__main__":
    main()
