"""Run directories: atomic writes, metrics JSONL, checkpoint bookkeeping.

Nothing is written in place: a file or checkpoint directory appears under its final name only
once it is complete, so a run killed at any moment leaves its last good state readable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator

from credo.config import UserError


@contextlib.contextmanager
def atomic_directory(path: str) -> Iterator[str]:
    """Yield a temporary directory beside `path`; on success it replaces `path` in one rename."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=parent)
    try:
        yield tmp
        if os.path.isdir(path):
            old = tmp + ".old"
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str, text: str) -> None:
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_jsonl(path: str, drop_torn_tail: bool = False) -> list[dict]:
    """Rows of a JSONL file. A line that is not JSON is an error naming it, except, with
    `drop_torn_tail`, an unterminated last line (a write cut short by a kill or a full disk)."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for line_number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rows.append(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if drop_torn_tail and line_number == len(lines):  # no newline after it: the write never finished
                break
            raise UserError(f"{path}:{line_number}: not valid JSON ({err})") from None
    return rows


class MetricsLog:
    """Append-only metrics.jsonl. Each row is one write() of a whole line to an O_APPEND file, so a
    kill leaves at most a torn last line; on resume the file is rewritten atomically to the rows up
    to the checkpoint's step, dropping such a line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def truncate_after(self, step: int) -> None:
        rows = [r for r in read_jsonl(self.path, drop_torn_tail=True) if r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def append(self, row: dict) -> None:
        line = (json.dumps(row) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes; disk full?)")
            os.fsync(fd)
        finally:
            os.close(fd)

    def rows(self) -> list[dict]:
        return read_jsonl(self.path)


KIND_MARKER = ".credo-kind"
# files that identify a run directory written before the marker existed
_SIGNATURES = {"train": ("config.yaml", "metrics.jsonl"), "sft": ("sft_config.yaml", "policy.json"),
               "audit": ("audit.json",), "compare": ("results.json",)}


def run_kind(path: str) -> str | None:
    """'train', 'sft', 'audit' or 'compare' if `path` is a credo output directory of that kind, else None."""
    marker = os.path.join(path, KIND_MARKER)
    if os.path.isfile(marker):
        with open(marker) as f:
            return f.read().strip() or None
    for kind, files in _SIGNATURES.items():
        if all(os.path.exists(os.path.join(path, name)) for name in files):
            return kind
    runs = os.path.join(path, "runs")  # a comparison stopped before its first result
    if os.path.isdir(runs) and os.listdir(runs) and all(run_kind(os.path.join(runs, r)) == "train" for r in os.listdir(runs)):
        return "compare"
    return None


def claim_output(path: str, kind: str, force: bool = False) -> bool:
    """Make `path` ready to hold a `kind` output; returns True if it already holds one (to continue or redo).

    A missing or empty directory is created and marked. A non-empty directory of another kind (or none)
    is refused, untouched, unless `force`: then it is first renamed aside (one atomic step) and removed,
    so `path` never holds a half-deleted mix of old and new files.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--out {path} is a file, not a directory; nothing was touched")
    if os.path.isdir(path) and os.listdir(path):
        if force:
            aside = tempfile.mkdtemp(prefix=".replaced-" + os.path.basename(os.path.abspath(path)) + "-",
                                     dir=os.path.dirname(os.path.abspath(path)))
            os.rename(path, os.path.join(aside, "old"))
            shutil.rmtree(aside, ignore_errors=True)
        else:
            found = run_kind(path)
            if found == kind:
                return True
            what = f"holds a credo {found} output" if found else "is not a credo output directory"
            raise UserError(f"--out {path} is not empty and {what}, not a {kind} run; nothing was touched "
                            "(choose another --out, or pass --force to replace it)")
    os.makedirs(path, exist_ok=True)
    atomic_write_text(os.path.join(path, KIND_MARKER), kind + "\n")
    return False


def cache_root() -> str:
    """Where SFT starts and MC references are cached ($CREDO_CACHE, default ~/.cache/credo)."""
    return os.environ.get("CREDO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "credo"))
