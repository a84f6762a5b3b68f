"""credo as a verl plugin, through verl's own loader (`import verl` loads every `verl.plugins` entry point): the
entry point pyproject.toml declares registers credo_grpo, credo_dr_grpo and credo_rloo, whose advantages are
verl's own GRPO's; with verl's plugins off they are unknown (the plugin, nothing else, registered them);
register_with_verl with other settings replaces the plugin's registration; a registration that fails is one line
on stderr naming the estimator, where verl itself logs it at DEBUG only.

Each case runs in a fresh interpreter whose first sys.path entry holds a `credo` distribution (dist-info) with the
entry points copied from pyproject.toml (the venv's editable install may predate them): a wrong entry point in
pyproject.toml fails these tests."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def declared_entry_points() -> dict[str, str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["entry-points"]["verl.plugins"]


def run_with_plugin(tmp_path, code: str, plugins: str = "auto") -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter that sees credo (this checkout) as a distribution declaring pyproject's
    verl.plugins entry points; VERL_USE_EXTERNAL_PLUGINS=plugins."""
    dist = tmp_path / "site" / "credo-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: credo\nVersion: 0.1.0\n")
    lines = [f"{name} = {target}" for name, target in declared_entry_points().items()]
    (dist / "entry_points.txt").write_text("[verl.plugins]\n" + "\n".join(lines) + "\n")
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": plugins,
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.path.join(ROOT, "src")])}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


SAME_AS_VERL = """
import numpy as np, torch
import verl
from verl.trainer.ppo import core_algos
g = torch.Generator().manual_seed(0)
mask = (torch.arange(6)[None, :] < torch.tensor([6, 4, 2, 5, 6, 3])[:, None]).float()
rewards = torch.zeros(6, 6)
rewards[torch.arange(6), mask.sum(1).long() - 1] = torch.rand(6, generator=g)
index = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, index)
for name in ("credo_grpo", "credo_dr_grpo", "credo_rloo"):
    fn = core_algos.get_adv_estimator_fn(name)
    print(name, fn.credo_estimator)
ours, _ = core_algos.get_adv_estimator_fn("credo_grpo")(rewards, mask, index)
print("max diff", float((ours - theirs).abs().max()), "max", float(ours.abs().max()))
if verl_plugins_on:  # register_with_verl after the plugin: new settings replace the plugin's registration
    from credo.integrations.verl import register_with_verl
    before = core_algos.get_adv_estimator_fn("credo_grpo")
    print(register_with_verl(checks=False), core_algos.get_adv_estimator_fn("credo_grpo") is not before)
"""


def test_verls_loader_registers_credos_estimators_and_they_equal_verls_grpo(tmp_path):
    assert declared_entry_points() == {"credo": "credo.integrations.verl_plugin"}
    result = run_with_plugin(tmp_path, "verl_plugins_on = True" + SAME_AS_VERL)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout.split("\n")
    assert out[:3] == ["credo_grpo grpo", "credo_dr_grpo dr_grpo", "credo_rloo rloo"]
    diff, largest = float(out[3].split()[2]), float(out[3].split()[4])
    assert diff < 1e-6 and largest > 0.5
    assert out[4] == "['credo_grpo', 'credo_dr_grpo', 'credo_rloo'] True"
    assert "credo: verl plugin" not in result.stderr


@pytest.mark.slow
def test_with_verls_plugins_off_the_estimators_are_unknown(tmp_path):
    result = run_with_plugin(tmp_path, "verl_plugins_on = False" + SAME_AS_VERL, plugins="none")
    assert result.returncode != 0 and "Unknown advantage estimator simply: credo_grpo" in result.stderr


CONFLICT = """
import importlib, os
import verl
from verl.trainer.ppo import core_algos
core_algos.register_adv_est("credo_grpo")(lambda *args, **kwargs: None)  # another package took the name
os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "auto"
importlib.reload(verl)  # verl's loader again, now with plugins on
print("still verl's import:", core_algos.get_adv_estimator_fn("credo_grpo").__name__)
print("the others:", core_algos.get_adv_estimator_fn("credo_rloo").__name__ if "credo_rloo" in
      core_algos.ADV_ESTIMATOR_REGISTRY else "none")
"""


@pytest.mark.slow
def test_a_failed_registration_is_one_loud_line_naming_the_estimator(tmp_path):
    result = run_with_plugin(tmp_path, CONFLICT, plugins="none")
    assert result.returncode == 0, result.stderr[-3000:]  # verl swallows the plugin's error; the run goes on
    loud = [line for line in result.stderr.splitlines() if line.startswith("credo: verl plugin")]
    assert len(loud) == 1, result.stderr[-3000:]
    assert loud[0].startswith("credo: verl plugin could not register estimator credo_grpo (ValueError: Adv "
                              "estimator credo_grpo has already been registered")
    assert loud[0].endswith("algorithm.adv_estimator=credo_grpo will be unknown to verl")
    assert "still verl's import: <lambda>" in result.stdout  # the other package's estimator was not replaced
    assert "the others: credo_rloo" in result.stdout  # the estimators that could register did
