"""One optimiser schedule (epochs x minibatches per batch) for every method, recorded in each run."""

import os

import pytest
import yaml

from credo.train import methods
from credo.train.trainer import Trainer, TrainConfig, load_train_config


def test_no_recipe_sets_its_own_schedule():
    default = (TrainConfig().epochs, TrainConfig().minibatches)
    assert default == (1, 4)  # the public SRPO code's schedule for GRPO and SRPO alike
    for name in methods.available():
        cfg = load_train_config(None, [f"method={name}"])
        assert (cfg.epochs, cfg.minibatches) == default, name


@pytest.mark.parametrize("method", ["grpo", "rrpo", "srpo"])
def test_runs_record_and_take_the_same_optimiser_steps(method, saved_policy, tmp_path):
    cfg = load_train_config(None, [f"method={method}", f"start={saved_policy}", "steps=1", "prompts_per_step=2",
                                   "group_size=4", "reset.n_fresh=2", "reset.n_reset=2", "reset.max_fresh_attempts=4",
                                   "sampling.max_new_tokens=16", "eval_n=2", "final_eval_n=0"])
    run = str(tmp_path / method)
    trainer = Trainer(cfg, run, progress=False)
    trainer.train()
    recorded = yaml.safe_load(open(os.path.join(run, "config.yaml")))
    assert (recorded["epochs"], recorded["minibatches"]) == (1, 4)
    steps = {int(state["step"]) for state in trainer.optimizer.state.values()}
    assert steps == {4}  # AdamW steps taken on the one batch
