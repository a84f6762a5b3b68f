"""Run directories: atomic writes, metrics JSONL, checkpoint bookkeeping.

Nothing is written in place: a file or checkpoint directory appears under its final name only
once it is complete, so a run killed at any moment leaves its last good state readable.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Iterator

from credo.core.compressed import read_record, stored_path
from credo.core.config import UserError
from credo.core.disk_errors import named_disk_errors
from credo.core.records import METRICS_FIELDS, checked_record


@contextlib.contextmanager
def atomic_directory(path: str) -> Iterator[str]:
    """Yield a temporary directory beside `path`; on success it replaces `path` in one rename."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    with named_disk_errors(path):
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


def _atomic_replace(path: str, write: Callable[[str], None]) -> None:
    """`write(tmp)` fills a temporary file beside `path`, which then replaces `path` in one rename, so a
    reader never sees half of it; the temporary file is removed if anything fails."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    with named_disk_errors(path):
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=parent)
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise


def atomic_write_with(path: str, write: Callable[[str], None]) -> None:
    """`write(tmp)` writes a whole file (e.g. safetensors' save_file), which then replaces `path` in one rename."""
    _atomic_replace(path, write)


def atomic_write_text(path: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    _atomic_replace(path, write)


def atomic_copy(source: str, destination: str) -> None:
    """Copies one file so that `destination` is either its old self or a whole copy, never half."""
    _atomic_replace(destination, lambda tmp: shutil.copyfile(source, tmp))


def is_within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies inside it, after resolving links."""
    path, folder = os.path.realpath(path), os.path.realpath(folder).rstrip(os.sep)
    return path == folder or path.startswith(folder + os.sep)


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_jsonl(path: str, drop_torn_tail: bool = False, fields: dict | None = None) -> list[dict]:
    """Rows of a JSONL file, or of its compressed copy `path.xz` (or an earlier export's `path.gz`;
    credo.core.compressed). A line that is not JSON
    is an error naming it, except, with `drop_torn_tail`, an unterminated last line (a write cut short by a kill
    or a full disk). With `fields` (credo.core.records), each row is a JSON object whose numbers among them are
    checked."""
    if stored_path(path) is None:
        return []
    rows = []
    lines = read_record(path).split(b"\n")
    for line_number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rows.append(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if drop_torn_tail and line_number == len(lines):  # no newline after it: the write never finished
                break
            raise UserError(f"{path}:{line_number}: not valid JSON ({err})") from None
        if fields is not None:
            checked_record(rows[-1], path, fields, line_number)
    return rows


class MetricsLog:
    """Append-only metrics.jsonl. Each row is one write() of a whole line to an O_APPEND file, so a
    kill leaves at most a torn last line; on resume the file is rewritten atomically to the rows up
    to the checkpoint's step, dropping such a line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def rows_up_to(self, step: int, must_reach: bool = False) -> list[dict]:
        """The rows up to `step` (a torn last line dropped). With `must_reach` (a resume from step's checkpoint)
        the log must hold step's own row, which is written before its checkpoint: a log cut shorter lost rows
        for good, and this refuses it."""
        rows = [r for r in read_jsonl(self.path, True, METRICS_FIELDS) if r.get("step", 0) <= step]
        if must_reach and step > 0 and not any(r.get("step") == step for r in rows):
            last = max((r.get("step", 0) for r in rows), default=None)
            raise UserError(f"{self.path} ends at step {last} but the checkpoint is at step {step}: rows were lost "
                            "(restore the file, or start a new run)")
        return rows

    def truncate_after(self, step: int, must_reach: bool = False) -> None:
        """Keep the rows up to `step` (see rows_up_to for `must_reach`)."""
        rows = self.rows_up_to(step, must_reach)
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def append(self, row: dict) -> None:
        line = (json.dumps(row) + "\n").encode()
        with named_disk_errors(self.path):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, line)
                if written != len(line):  # a regular file is written short only when its disk is full
                    raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)", self.path)
                os.fsync(fd)
            finally:
                os.close(fd)

    def rows(self) -> list[dict]:
        return read_jsonl(self.path, fields=METRICS_FIELDS)


class NullLog:
    """The metrics sink of a data-parallel rank that is not the main one: only the main process writes.
    Given the run's log path, it still makes a resume's check (a log cut short is refused on every rank,
    not on the main one alone, which would leave the others waiting at their first collective)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def truncate_after(self, step: int, must_reach: bool = False) -> None:
        if must_reach and self.path is not None:  # read only: the main rank rewrites the file atomically
            MetricsLog(self.path).rows_up_to(step, must_reach=True)

    def append(self, row: dict) -> None:
        pass

    def rows(self) -> list[dict]:
        return []


def last_checkpoint(run_dir: str) -> str | None:
    """The newest whole checkpoint of `run_dir` (checkpoints/step-N), or None. A checkpoints/ folder that holds
    none (a run that died writing its first one: a full disk, a file-size limit) does not make it a run with
    a checkpoint; nor does a temporary directory a killed write left in it."""
    folder = os.path.join(run_dir, "checkpoints")
    steps = sorted(d for d in os.listdir(folder) if d.startswith("step-")) if os.path.isdir(folder) else []
    return os.path.join(folder, steps[-1]) if steps else None


def cache_root() -> str:
    """Where SFT starts and MC references are cached ($CREDO_CACHE, default ~/.cache/credo)."""
    return os.environ.get("CREDO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "credo"))
