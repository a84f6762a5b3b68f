"""Each run records the credo that trained it; a comparison whose runs name two versions says so."""

import json
import os
import re

from credo import provenance
from credo.compare_report import commit_lines, report, summarise
from credo.train import Trainer
from test_train import config


def test_source_commit_names_the_checkout_or_the_version(monkeypatch, tmp_path):
    recorded = provenance.source_commit()
    if os.path.isdir(os.path.join(os.path.dirname(provenance._SOURCE), "..", ".git")):
        assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", recorded), recorded
    monkeypatch.setattr(provenance, "_SOURCE", str(tmp_path))  # no git checkout here
    assert provenance.source_commit() == f"credo {provenance.__version__}"


def test_dirty_package_is_marked(monkeypatch, tmp_path):
    import subprocess
    repo = tmp_path / "repo"
    package = repo / "pkg"
    package.mkdir(parents=True)
    (package / "m.py").write_text("x = 1\n")
    (repo / "README").write_text("a\n")
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "x", "--allow-empty")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "files")
    monkeypatch.setattr(provenance, "_SOURCE", str(package))
    clean = provenance.source_commit()
    assert re.fullmatch(r"[0-9a-f]{40}", clean)
    (repo / "README").write_text("b\n")  # outside the package: what trains is unchanged
    assert provenance.source_commit() == clean
    (package / "m.py").write_text("x = 2\n")
    assert provenance.source_commit() == clean + "+dirty"


def test_a_run_records_its_commit(saved_policy, tmp_path):
    Trainer(config(saved_policy, "steps=1", "method=grpo"), str(tmp_path / "r"), progress=False).train()
    summary = json.load(open(tmp_path / "r" / "summary.json"))
    assert summary["credo_commit"] == provenance.source_commit()
    from credo.compare import run_result
    assert run_result(str(tmp_path / "r"))["commit"] == summary["credo_commit"]


def _results(commits):
    run = lambda c: {"curve": [{"step": 0, "tokens_generated": 0, "accuracy": 0.3},  # noqa: E731
                               {"step": 5, "tokens_generated": 500, "accuracy": 0.4, "final": True}],
                     "final_accuracy": 0.4, "seconds_per_step": 1.0, "steps": 5, "tokens_generated": 500,
                     **({"commit": c} if c else {})}
    return {"methods": {"grpo": {"seeds": {str(i): run(c) for i, c in enumerate(commits)}}}, "token_budget": 500,
            "failures": {}, "preset": "t", "start": "s", "commit": "c", "date": "d", "machine": "m"}


def test_report_warns_only_when_runs_name_more_than_one_commit():
    a, b = "a" * 40, "b" * 40
    assert commit_lines(_results([a, a])) == []
    assert commit_lines(_results([None, None])) == []  # runs from before the record: nothing to compare
    mixed = _results([a, a, b + "+dirty", None])
    line = commit_lines(mixed)[0]
    assert line.startswith("**Runs trained by 3 versions of credo**")
    assert f"`{a[:10]}` (2 runs), `{b[:10]}+dirty` (1 run), not recorded (1 run)" in line
    summarise(mixed)
    assert line in report(mixed)
