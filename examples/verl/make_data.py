"""Write a credo task as verl RL-dataset parquet files (train/val), one `dataset_row` per problem.

    python examples/verl/make_data.py --task gym:chain_sum --train 2048 --val 256 --out data/chain_sum

Each row carries the chat prompt (the task's system prompt + question), the gold answer for verl's reward
and, in extra_info, the credo Problem and task (for credo.integrations.verl_credit.compute_score and for
apply_credit on the workers).
"""

from __future__ import annotations

import argparse
import json
import os

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="gym:chain_sum", help="a credo task name (credo tasks)")
    parser.add_argument("--task-options", default="{}", help="the task's options as JSON")
    parser.add_argument("--train", type=int, default=2048, help="training problems")
    parser.add_argument("--val", type=int, default=256, help="held-out problems")
    parser.add_argument("--out", default="data/credo", help="output directory (train.parquet, val.parquet)")
    args = parser.parse_args()
    import pandas as pd

    from credo.integrations.verl_credit import dataset_row
    from credo.tasks import make_task
    task = make_task(args.task, json.loads(args.task_options))
    os.makedirs(args.out, exist_ok=True)
    splits = {"train": task.train_problems(args.train, torch.Generator().manual_seed(0)),
              "val": task.heldout_problems(args.val)}
    for split, problems in splits.items():
        path = os.path.join(args.out, f"{split}.parquet")
        pd.DataFrame([dataset_row(task, p) for p in problems]).to_parquet(path)
        print(f"{path}: {len(problems)} rows")


if __name__ == "__main__":
    main()
