import pytest

from credo.core.config import ConfigError, load_config
from credo.train.sft_config import SFTConfig
from credo.train.config import TrainConfig
from credo.train.plan import load_train_config


def test_unknown_field_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-5\nlearning_rate: 3\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        load_train_config(str(path))
    with pytest.raises(ConfigError, match="loss.eps_hi"):
        load_train_config(None, ["loss.eps_hi=0.3"])


def test_out_of_range_and_wrong_type_are_named():
    with pytest.raises(ConfigError, match="train.group_size"):
        load_train_config(None, ["group_size=1"])
    with pytest.raises(ConfigError, match="lr"):
        load_train_config(None, ["lr=fast"])
    with pytest.raises(ConfigError, match="train.loss.aggregation must"):
        load_train_config(None, ["loss.aggregation=mean"])
    with pytest.raises(ConfigError, match="task.digits"):
        load_config(SFTConfig, None, ["task.digits=9"])
    with pytest.raises(ConfigError, match="train.method"):
        load_train_config(None, ["method=magic"])


def test_recipe_defaults_apply_and_user_overrides_win(tmp_path):
    cfg = load_train_config(None, ["method=dapo"])
    assert cfg.loss.eps_high == 0.28 and cfg.loss.aggregation == "token-mean" and cfg.strategy == "dynamic"
    cfg = load_train_config(None, ["method=dapo", "loss.eps_high=0.3"])
    assert cfg.loss.eps_high == 0.3 and cfg.strategy == "dynamic"
    path = tmp_path / "c.yaml"
    path.write_text("method: gspo\nsteps: 7\n")
    cfg = load_train_config(str(path))
    assert cfg.loss.ratio == "sequence" and cfg.steps == 7
    assert load_train_config(None).loss == TrainConfig().loss
