"""scripts/clip_off_table.py pairs two comparison folders' runs by method, credit options and seed."""

from __future__ import annotations

import json
import os
import runpy
import shutil

import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..")
SKILLED = os.path.join(ROOT, "docs", "results", "compare-long-skilled", "runs")
table = runpy.run_path(os.path.join(ROOT, "scripts", "clip_off_table.py"))


def copy_run(name: str, folder, final: float | None = None, grad_clip: float | None = None,
             as_named: str | None = None, credit_options: dict | None = None) -> None:
    """A committed compare-long-skilled run copied into folder/runs (as `as_named`), its final accuracy, clip or
    credit options changed (a newer credo records every option where an older one recorded none)."""
    target = folder / "runs" / (as_named or name)
    shutil.copytree(os.path.join(SKILLED, name), target)
    if final is not None:
        summary = json.load(open(target / "summary.json"))
        json.dump({**summary, "final_accuracy": final}, open(target / "summary.json", "w"))
    config = yaml.safe_load(open(target / "config.yaml"))
    if grad_clip is not None:
        config["grad_clip"] = grad_clip
    if credit_options is not None:
        config["credit"]["options"] = credit_options
    yaml.safe_dump(config, open(target / "config.yaml", "w"))


def test_rows_pair_seeds_of_one_method_and_never_two_forms_of_one_estimator(tmp_path):
    clipped, unclipped = tmp_path / "on", tmp_path / "off"
    for name in ("grpo-s0", "grpo-s1", "grpo-s2", "ibpo_preserve_mass=true-s0"):
        copy_run(name, clipped)
    finals = {"grpo-s0": 0.70, "grpo-s1": 0.71}
    for name, final in finals.items():
        copy_run(name, unclipped, final, grad_clip=1e6)
    copy_run("ibpo_preserve_mass=false-s0", unclipped, 0.5, grad_clip=1e6)  # no clipped twin: no row
    rows = table["rows"](table["finished_runs"](str(clipped)), table["finished_runs"](str(unclipped)))
    assert [row["label"] for row in rows] == ["grpo"]
    row = rows[0]
    on = [json.load(open(os.path.join(SKILLED, n, "summary.json")))["final_accuracy"] for n in finals]
    assert row["seeds"] == [0, 1] and row["clip"] == 1.0
    assert abs(row["delta"]["mean"] - (sum(finals.values()) - sum(on)) / 2) < 1e-12
    assert row["on_share"] == row["off_share"] > 0  # the same norms, measured against the clipped folder's clip
    assert row["delta"]["family_size"] == 1 and "p_holm" in row["delta"]
    assert "| grpo | 0,1 |" in table["markdown"](rows)


def test_a_folder_without_runs_is_one_line_naming_it(tmp_path, capsys):
    assert table["main"]([str(tmp_path), str(tmp_path)]) == 2
    expected = f"clip_off_table: {tmp_path}: no runs/ folder (give a credo compare output folder)"
    assert capsys.readouterr().err.strip() == expected


def test_a_method_is_paired_across_record_versions_and_never_with_another_reset(tmp_path, capsys):
    clipped, unclipped = tmp_path / "on", tmp_path / "off"
    copy_run("shuffled_of=rredcot-s0", clipped)  # recorded `options: {}`
    copy_run("srpo_localiser=prompt-s0", clipped)
    # a row is named as the clipped comparison named its method; the in-progress folder has no results.json
    named = {"methods": {"srpo:localiser=prompt": {}, "shuffled:of=rredcot": {}}}
    json.dump(named, open(clipped / "results.json", "w"))
    copy_run("shuffled_of=rredcot-s0", unclipped, 0.6, 1e6, credit_options={"candidates": "suffixes", "probe": ""})
    copy_run("srpo_localiser=value-s0", unclipped, 0.6, 1e6, as_named="srpo_localiser=value-s0")
    rows = table["rows"](table["finished_runs"](str(clipped)), table["finished_runs"](str(unclipped)))
    assert [row["label"] for row in rows] == ["shuffled:of=rredcot"]  # the value localiser is another reset
    assert capsys.readouterr().err == ("clip_off_table: srpo_localiser=value-s0: no clipped run of the same method "
                                       "and seed (left out)\n")
    copy_run("shuffled_of=rredcot-s0", clipped, as_named="copy-s0")
    with pytest.raises(SystemExit, match="matches 2 clipped runs"):
        table["rows"](table["finished_runs"](str(clipped)), table["finished_runs"](str(unclipped)))
