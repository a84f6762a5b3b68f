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


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line_number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({err.msg})") from None
    return rows


class MetricsLog:
    """Append-only metrics.jsonl. On resume it is rewritten atomically to the rows up to a step."""

    def __init__(self, path: str) -> None:
        self.path = path

    def truncate_after(self, step: int) -> None:
        rows = [r for r in read_jsonl(self.path) if r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def append(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()

    def rows(self) -> list[dict]:
        return read_jsonl(self.path)


def cache_root() -> str:
    """Where SFT starts and MC references are cached ($CREDO_CACHE, default ~/.cache/credo)."""
    return os.environ.get("CREDO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "credo"))
