"""One optimiser schedule (epochs x minibatches per batch) for every method, recorded in each run."""

import os

import pytest
import yaml

from credo.train import methods
from credo.train.config import TrainConfig
from credo.train.plan import load_train_config
from credo.train.trainer import Trainer


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


def test_a_reset_recipe_takes_its_localiser_in_the_spec_and_is_as_privileged_as_it():
    from credo.train.plan import load_train_config
    config = load_train_config(None, ["method=srpo:localiser=prompt"])
    assert (config.strategy, config.reset.localiser, config.credit["std"]) == ("resets", "prompt", "population")
    assert not methods.privileged("srpo:localiser=prompt") and methods.privileged("srpo:localiser=value")
    assert methods.privileged("srpo")  # `self` falls back to the value localiser where the policy cannot be asked
    assert methods.privileged("rredcot") and not methods.privileged("rredcot:include_reference=false")


def test_the_round_two_presets_name_known_methods_and_need_their_start(tmp_path):
    from credo.core.config import ConfigError
    from credo.lab.compare.presets import PRESETS, check_method_specs
    from credo.lab.compare.run import compare
    for name in ("long-skilled", "smollm2-long"):
        preset = PRESETS[name]
        check_method_specs(preset.methods, f"compare --preset {name}")
        assert preset.methods[0] == "grpo" and len(set(preset.methods)) == len(preset.methods)
        with pytest.raises(ConfigError, match=rf"^--preset {name} needs --start: "):
            compare(name, str(tmp_path / name), progress=False)
        assert not os.path.exists(tmp_path / name)  # refused before anything was written
    marked = {m for m in PRESETS["long-skilled"].methods if methods.privileged(m)}
    assert marked == {"rredcot", "shuffled:of=rredcot", "srpo:localiser=value"}
