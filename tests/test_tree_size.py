"""The repository fits through the door: what is sent to a GPU machine lent for a check (the tracked tree, the
project's shared notes and the wheels of the packages it lacks) may hold 64 MiB, so the tracked tree stays under
40 MiB, leaving the rest for the wheels (docs/gpu.md). Measured with `git ls-files` in a git checkout (the files'
sizes in the work tree); skipped elsewhere (an sdist, an installed package)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LIMIT = 40 * 2**20
"""Bytes the tracked tree stays under."""


def tracked_bytes(root: str) -> dict[str, int] | None:
    """{path: size} of every file git tracks under `root` that is present in the work tree; None when `root` is not
    in a git checkout (or git is missing)."""
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True)
    if done.returncode != 0:
        return None
    paths = [p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    return {p: os.path.getsize(os.path.join(root, p)) for p in paths if os.path.isfile(os.path.join(root, p))}


def test_the_tracked_tree_stays_under_40_mib():
    sizes = tracked_bytes(ROOT)
    if sizes is None:
        pytest.skip("not a git checkout: the tracked tree is not defined")
    total = sum(sizes.values())
    largest = ", ".join(f"{p} {s / 2**20:.1f} MiB" for p, s in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert total < LIMIT, (f"the tracked tree holds {total / 2**20:.1f} MiB, over the {LIMIT / 2**20:.0f} MiB that "
                           f"leaves room for a GPU check's wheels (docs/gpu.md); largest: {largest}")


def test_the_measure_counts_tracked_files_only(tmp_path):
    """tracked_bytes sees a tracked file's size, not an untracked one, and nothing outside a checkout."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    assert tracked_bytes(str(tmp_path)) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "kept.bin").write_bytes(b"x" * 3000)
    (tmp_path / "stray.bin").write_bytes(b"x" * 5000)
    subprocess.run(["git", "-C", str(tmp_path), "add", "kept.bin"], check=True)
    assert tracked_bytes(str(tmp_path)) == {"kept.bin": 3000}
