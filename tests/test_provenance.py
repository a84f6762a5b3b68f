"""Each run records the credo and the hardware that trained it; a comparison whose runs name two of either says
so."""

import json
import os
import re
import subprocess

import pytest

from credo.train import provenance
from credo.lab.compare.report import commit_lines, machine_lines, report, summarise
from credo.train.trainer import Trainer
from builders import dapo_config

REPO = os.path.dirname(os.path.dirname(provenance._SOURCE))  # src/credo -> the checkout


@pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".git")), reason="not a git checkout")
def test_source_commit_is_the_last_commit_that_changed_the_package():
    expected = subprocess.run(["git", "log", "-1", "--format=%H", "--", "src/credo"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{40}", expected)
    assert provenance.source_commit() in (expected, expected + "+dirty")


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_docs_commits_keep_the_value_package_edits_mark_it_dirty_untracked_copies_are_versions(monkeypatch, tmp_path):
    repo, package = tmp_path / "repo", tmp_path / "repo" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    (repo / "README").write_text("a\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "package")
    monkeypatch.setattr(provenance, "_SOURCE", str(package))
    clean = provenance.source_commit()
    assert re.fullmatch(r"[0-9a-f]{40}", clean)
    (repo / "README").write_text("b\n")  # outside the package: what trains is unchanged, committed or not
    assert provenance.source_commit() == clean
    _git(repo, "commit", "-qam", "docs only")
    assert provenance.source_commit() == clean
    (package / "__init__.py").write_text("x = 2\n")
    assert provenance.source_commit() == clean + "+dirty"
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))  # the caller's git settings are not credo's
    assert provenance.source_commit() == clean + "+dirty"
    # an installed copy inside some other repository (an ignored .venv) is not that repository's commit
    installed = repo / ".venv" / "credo"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text(".venv/\n")
    monkeypatch.setattr(provenance, "_SOURCE", str(installed))
    assert provenance.source_commit() == f"credo {provenance.__version__}"
    monkeypatch.setattr(provenance, "_SOURCE", str(tmp_path))  # no repository at all
    assert provenance.source_commit() == f"credo {provenance.__version__}"


def test_a_run_records_the_commit_read_when_its_trainer_was_built_not_when_it_finished(saved_policy, tmp_path,
                                                                                      monkeypatch):
    on_disk = {"commit": "a" * 40}
    monkeypatch.setattr(provenance, "source_commit", lambda: on_disk["commit"])
    provenance.loaded_commit.cache_clear()
    try:
        trainer = Trainer(dapo_config(saved_policy, "steps=1", "method=grpo"), str(tmp_path / "r"), progress=False)
        on_disk["commit"] = "b" * 40  # a commit made while the run trains
        trainer.train()
    finally:
        provenance.loaded_commit.cache_clear()
    summary = json.load(open(tmp_path / "r" / "summary.json"))
    assert summary["credo_commit"] == "a" * 40
    from credo.lab.compare.runs import run_result
    from credo.policy.device import hardware
    import torch
    assert summary["machine"] == hardware(torch.device("cpu")) and "torch " + torch.__version__ in summary["machine"]
    assert run_result(str(tmp_path / "r"))["commit"] == "a" * 40
    assert run_result(str(tmp_path / "r"))["machine"] == summary["machine"]


def test_the_hardware_a_run_records_names_the_cpus_widest_vector_unit_and_its_threads(tmp_path, monkeypatch):
    """AVX2 and AVX-512 kernels round float32 sums differently: a run's record must tell the two apart."""
    import torch
    from credo.policy.device import hardware
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert hardware(torch.device("cpu"), str(cpuinfo)) == f"AMD EPYC (AVX2), 1 thread, torch {torch.__version__}"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: avx2 avx512f avx512_bf16\n")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert hardware(torch.device("cpu"), str(cpuinfo)).startswith("AMD EPYC (AVX-512, BF16), 2 threads, torch ")
    assert hardware(torch.device("cpu"), str(tmp_path / "absent")).startswith("cpu, 2 threads")


def test_report_notes_runs_on_more_than_one_kind_of_hardware():
    one, other = "AMD EPYC (AVX2), 1 thread, torch 2.13.0+cpu", "AMD EPYC (AVX-512, BF16), 1 thread, torch 2.13.0+cpu"
    results = _results([None, None, None, None])
    assert machine_lines(results) == []
    seeds = results["methods"]["grpo"]["seeds"]
    seeds["0"]["machine"], seeds["1"]["machine"] = one, one
    assert machine_lines(results) == []  # runs from before the record are no second setup
    seeds["2"]["machine"] = other
    line = machine_lines(results)[0]
    assert line.startswith("**Runs computed on 2 setups**")
    assert f"{one} (2 runs); {other} (1 run)" in line and "do not compare" in line
    summarise(results)
    assert line in report(results)


def _results(commits):
    run = lambda c: {"curve": [{"step": 0, "tokens_generated": 0, "accuracy": 0.3},  # noqa: E731
                               {"step": 5, "tokens_generated": 500, "accuracy": 0.4, "final": True}],
                     "final_accuracy": 0.4, "seconds_per_step": 1.0, "steps": 5, "tokens_generated": 500,
                     **({"commit": c} if c else {})}
    return {"methods": {"grpo": {"seeds": {str(i): run(c) for i, c in enumerate(commits)}}}, "token_budget": 500,
            "failures": {}, "preset": "t", "start": "s", "commit": "credo 0.1.0", "date": "d", "machine": "m"}


def test_report_warns_only_when_runs_name_more_than_one_commit():
    a, b = "a" * 40, "b" * 40
    assert commit_lines(_results([a, a])) == []
    assert commit_lines(_results([None, None])) == []  # runs from before the record: nothing to compare
    mixed = _results([a, a, b + "+dirty", None])
    line = commit_lines(mixed)[0]
    assert line.startswith("**Runs trained by 3 versions of credo**")
    assert f"`{a[:10]}` (2 runs), `{b[:10]}+dirty` (1 run), not recorded (1 run)" in line
    assert line.endswith("check `git diff` between them.")  # commits this checkout does not hold: unknown
    summarise(mixed)
    text = report(mixed)
    assert line in text and "commit `credo 0.1.0`" in text  # a version string is not cut to 10 characters


def test_the_note_on_several_versions_lists_the_package_files_that_differ_between_them(monkeypatch, tmp_path):
    """What a reader must check (did a change between the versions touch training?) is listed, read from git."""
    repo, package = tmp_path / "repo", tmp_path / "repo" / "pkg"
    (package / "lab").mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    (package / "lab" / "grid.py").write_text("a = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    (package / "lab" / "grid.py").write_text("a = 2\n")
    (repo / "README").write_text("outside the package\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "two")
    (package / "policy").mkdir()
    (package / "policy" / "device.py").write_text("d = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "three")
    one, two, three = (subprocess.run(["git", "rev-parse", f"HEAD~{n}"], cwd=repo, capture_output=True, text=True,
                                      check=True).stdout.strip() for n in (2, 1, 0))
    monkeypatch.setattr(provenance, "_SOURCE", str(package))
    assert provenance.package_changes([one, two]) == ["lab/grid.py"]
    assert provenance.package_changes([two, three, one]) == ["lab/grid.py", "policy/device.py"]
    assert provenance.package_changes([three, three + "+dirty"]) == []
    assert provenance.package_changes([one, "credo 0.1.0"]) is None  # an installed copy: git cannot tell
    assert provenance.package_changes([one, "c" * 40]) is None  # a commit this checkout does not hold
    assert provenance.package_changes(["c" * 40]) is None and provenance.package_changes([]) is None
    line = commit_lines(_results([one, three, three]))[0]
    assert line.endswith("The package's files that differ between their commits: `lab/` grid; `policy/` device. "
                         "A change there that touched training makes this table compare different programs.")
    line = commit_lines(_results([two, two + "+dirty"]))[0]
    assert line.endswith("No file of the package differs between their commits (not counting the uncommitted "
                         "edits of '+dirty' ones).")
    line = commit_lines(_results([one, three, None]))[0]
    assert "(not counting what trained the runs that recorded no version): `lab/` grid; `policy/` device" in line
    for unknowable in ([two, None], [two, two + "+dirty", None]):  # older code beside one commit: nothing to diff
        assert commit_lines(_results(unknowable))[0].endswith("check `git diff` between them.")
    copy = repo / "site-packages" / "pkg"  # an installed copy inside the checkout, untracked: git cannot tell
    copy.mkdir(parents=True)
    (copy / "__init__.py").write_text("x = 1\n")
    monkeypatch.setattr(provenance, "_SOURCE", str(copy))
    assert provenance.package_changes([one, three]) is None
