"""A Hugging Face SFT stopped part-way goes on from its last validation check (credo.train.sft_resume) and ends
with the start an unbroken run writes, bit for bit: the weights, the best check's weights, AdamW's moments and
the three random streams (the tiny random Llama, LoRA with dropout, so torch's global stream is drawn from)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from builders import CHAIN_SUM_OPTIONS
from credo.cli.sft import check_snapshots_dir, where_stopped
from credo.core.config import ConfigError
from credo.policy.adapters import ADAPTER_WEIGHTS, LoraSettings
from credo.train import sft_hf
from credo.train.sft_hf import HFSFTConfig, train_hf_sft
from credo.train.sft_resume import RESUME_DIR

# validation accuracies of the checks at steps 0, 2, 4, 6: the best is step 2's, kept through the stop after step 4
ACCURACIES = [0.0, 0.5, 0.25, 0.1]


def config(hf_dir: str, **changes) -> HFSFTConfig:
    settings = dict(start=hf_dir, task_options=CHAIN_SUM_OPTIONS, steps=6, batch_size=2, lr=1e-2, warmup_steps=2,
                    eval_every=2, eval_n=2, max_new_tokens=4, target_accuracy=1.0, device="cpu",
                    lora=LoraSettings(r=4, dropout=0.2), reference_frac=0.3)
    return HFSFTConfig(**{**settings, **changes})


@pytest.fixture
def scripted_checks(monkeypatch):
    """Each run's validation checks score ACCURACIES in turn (the tiny model scores 0 throughout)."""
    calls = []

    def evaluate(*args, **kwargs):
        calls.append(1)
        return SimpleNamespace(accuracy=ACCURACIES[len(calls) - 1])

    monkeypatch.setattr(sft_hf, "evaluate", evaluate)
    return calls


def stop_before_step(monkeypatch, step: int) -> None:
    """The SFT is stopped (Ctrl-C) as it starts its 0-based `step`."""
    real, seen = sft_hf.sft_loss, []

    def loss(*args, **kwargs):
        seen.append(1)
        if len(seen) > step:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sft_hf, "sft_loss", loss)


def history(out: str) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in f]


@pytest.mark.parametrize("keep,save_every,saved_at", [("best", 0.0, 4), ("last", None, 2)])
def test_a_stopped_sft_goes_on_from_its_last_saved_check_and_writes_the_start_an_unbroken_run_writes(
        hf_dir, tmp_path, monkeypatch, scripted_checks, keep, save_every, saved_at):
    """keep=best: the state is saved at every check, the stop comes after step 4's, and the start holds step 2's
    weights (the best check's, saved beside the current ones); keep=last: saved once per SAVE_EVERY_SECONDS, so at
    step 2 only, and the start holds the weights the resumed steps 3-6 trained."""
    if save_every is not None:
        monkeypatch.setattr(sft_hf, "SAVE_EVERY_SECONDS", save_every)
    whole, broken = str(tmp_path / "whole"), str(tmp_path / "broken")
    summary = train_hf_sft(config(hf_dir, keep=keep), whole, progress=False)
    assert summary["step"] == (2 if keep == "best" else 6) and not os.path.exists(os.path.join(whole, RESUME_DIR))
    scripted_checks.clear()
    with monkeypatch.context() as stopped:
        stop_before_step(stopped, 4)  # after the check at step 4
        with pytest.raises(KeyboardInterrupt):
            train_hf_sft(config(hf_dir, keep=keep), broken, progress=False)
    assert where_stopped(broken, "SIGINT") == (f"stopped by SIGINT; {os.path.join(broken, RESUME_DIR)} holds the SFT "
                                               f"at step {saved_at}, a validation check: the same command goes on "
                                               "from there (--retrain: from the start)")
    del scripted_checks[1 + saved_at // 2:]  # the checks after the saved one are made again
    resumed = train_hf_sft(config(hf_dir, keep=keep), broken, progress=False)
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in summary.items() if k != "seconds"}
    assert not os.path.exists(os.path.join(broken, RESUME_DIR))
    ours, theirs = load_file(os.path.join(broken, ADAPTER_WEIGHTS)), load_file(os.path.join(whole, ADAPTER_WEIGHTS))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert history(broken) == history(whole) and [r["step"] for r in history(whole)] == [0, 2, 4, 6]


def test_a_part_way_sft_with_other_settings_is_refused_naming_them(hf_dir, tmp_path, monkeypatch, scripted_checks):
    out = str(tmp_path / "sft")
    with monkeypatch.context() as stopped:
        stop_before_step(stopped, 2)
        with pytest.raises(KeyboardInterrupt):
            train_hf_sft(config(hf_dir), out, progress=False)
    with pytest.raises(ConfigError, match=r"holds a part-way SFT with other settings \(sft\.lr\)"):
        train_hf_sft(config(hf_dir, lr=2e-2), out, progress=False)
    with monkeypatch.context() as stopped:  # --retrain discards the state before it trains
        stop_before_step(stopped, 0)
        with pytest.raises(KeyboardInterrupt):
            train_hf_sft(config(hf_dir, lr=2e-2), out, progress=False, resume=False)
    assert not os.path.exists(os.path.join(out, RESUME_DIR))
    assert where_stopped(out, "SIGINT", retrain=True) == ("stopped by SIGINT before its first saved check; the same "
                                                          "command starts it again")
    scripted_checks.clear()
    train_hf_sft(config(hf_dir, lr=2e-2), out, progress=False)
    assert [r["step"] for r in history(out)] == [0, 2, 4, 6]


def test_going_on_accepts_snapshots_holding_only_earlier_step_folders(tmp_path):
    snapshots, out = tmp_path / "snap", str(tmp_path / "out")
    (snapshots / "step-2").mkdir(parents=True)
    check_snapshots_dir(str(snapshots), out, resuming=True)
    with pytest.raises(ConfigError, match="not a new or empty directory"):
        check_snapshots_dir(str(snapshots), out)
    (snapshots / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="nor one holding only this SFT's earlier step-N snapshots"):
        check_snapshots_dir(str(snapshots), out, resuming=True)
    assert where_stopped(out, "SIGTERM") == ("stopped by SIGTERM before its first saved check; the same command "
                                             "starts it again")
    (snapshots / "notes.txt").unlink()
    (snapshots / ".tmp-step-4-x1").mkdir()  # a snapshot cut short by a kill is not one
    check_snapshots_dir(str(snapshots), out, resuming=True)
