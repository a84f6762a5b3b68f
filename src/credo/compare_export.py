"""`credo compare --out OUT --export DEST`: a comparison's finished runs, and its report once there is one, in
a folder small enough to commit or copy to another machine; `credo compare --out DEST` resumes from it.

A finished run is reused from its config.yaml, metrics.jsonl and summary.json alone (compare.run_one reads
nothing else), so only those are copied: no weights, checkpoints or locks (a 3.2M-parameter run's checkpoint
is ~40 MB, its record ~100 kB). A part-way run is left out: it resumes only from its checkpoints, and its config
and log without them would be refused as a run whose checkpoints were removed. OUT is only read, so this is
safe beside the running comparison (a run's summary.json is its last file, written atomically). Each file is
written atomically into DEST; nothing in DEST is deleted, and DEST must be missing, empty or a comparison.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import tempfile
from dataclasses import dataclass, field

from credo.config import UserError
from credo.runs import KIND_MARKER, atomic_write_text, claim_output, run_kind

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")
"""What a finished run is reused from."""
REPORT_FILES = ("results.json", "report.md", "*.png", "failure-*.txt")
"""A comparison's own files beside runs/ (its audit/ folder is copied too)."""


@dataclass
class Exported:
    """What an export copied: the finished runs, the part-way runs left out, and whether a report came along."""

    runs: list[str] = field(default_factory=list)
    part_way: list[str] = field(default_factory=list)
    report: bool = False


def _copy(source: str, destination: str) -> None:
    """One file, atomically: a reader of DEST never sees half of it."""
    parent = os.path.dirname(destination)
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=parent)
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, destination)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def export(out_dir: str, dest: str) -> Exported:
    """Copies out_dir's finished runs (RUN_FILES each) and its report files into dest; returns what it did."""
    if not os.path.isdir(out_dir) or run_kind(out_dir) != "compare":
        raise UserError(f"--out {out_dir} is not a credo comparison (no results.json nor runs/ of training runs)")
    if _inside(dest, out_dir) or _inside(out_dir, dest):
        raise UserError(f"--export {dest} is --out {out_dir} or holds it or lies inside it; choose a folder apart")
    claim_output(dest, "compare")  # a foreign non-empty folder is refused untouched
    done = Exported()
    runs = os.path.join(out_dir, "runs")
    for name in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
        run = os.path.join(runs, name)
        if not os.path.isdir(run):
            continue
        if not all(os.path.isfile(os.path.join(run, f)) for f in RUN_FILES):
            if os.path.isfile(os.path.join(run, "config.yaml")):
                done.part_way.append(name)
            continue
        # summary.json last: a reader of DEST that sees it sees the whole run, as in the run directory itself
        for f in RUN_FILES:
            _copy(os.path.join(run, f), os.path.join(dest, "runs", name, f))
        atomic_write_text(os.path.join(dest, "runs", name, KIND_MARKER), "train\n")
        done.runs.append(name)
    for entry in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, entry)
        if os.path.isfile(path) and any(fnmatch.fnmatchcase(entry, p) for p in REPORT_FILES):
            _copy(path, os.path.join(dest, entry))
            done.report = done.report or entry == "results.json"
    audit = os.path.join(out_dir, "audit")
    if os.path.isdir(audit):
        for entry in sorted(os.listdir(audit)):
            if os.path.isfile(os.path.join(audit, entry)) and not entry.startswith("."):
                _copy(os.path.join(audit, entry), os.path.join(dest, "audit", entry))
    return done


def describe(done: Exported, dest: str) -> str:
    """One line for the terminal."""
    text = f"exported {len(done.runs)} finished run(s) to {dest}"
    if done.part_way:
        text += (f"; left out {len(done.part_way)} part-way ({', '.join(done.part_way)}): they resume only where "
                 "their checkpoints are")
    if done.report:
        text += "; with the report"
    return text
