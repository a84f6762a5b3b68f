"""Worker for tests/test_distributed.py: one data-parallel training run (launched by torch.distributed.run)."""

import sys

import torch

from credo.train.plan import load_train_config
from credo.train.trainer import Trainer

if __name__ == "__main__":
    torch.set_num_threads(1)
    out, start = sys.argv[1], sys.argv[2]
    config = load_train_config(None, [f"start={start}", "method=grpo", "data_parallel=true", "steps=2",
                                      "prompts_per_step=4", "group_size=4",
                                      "sampling.max_new_tokens=20", "overlong_buffer=12",
                                      "loss.aggregation=token-mean", "minibatches=1", "eval_n=4",
                                      "final_eval_n=4", "lr=1e-3"])
    Trainer(config, out, progress=False).train()
