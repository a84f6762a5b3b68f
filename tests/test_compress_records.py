"""scripts/compress_records.py stores a folder's run logs as metrics.jsonl.xz, from the plain log or an older
export's .gz, with the same content, and stops, keeping every copy, where a log has more than one."""

from __future__ import annotations

import gzip
import os
import runpy

import pytest

from credo.core.compressed import read_record

ROOT = os.path.join(os.path.dirname(__file__), "..")
script = runpy.run_path(os.path.join(ROOT, "scripts", "compress_records.py"))
LOG = b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n'


def test_plain_and_gzip_logs_become_xz_with_the_same_content(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_bytes(LOG)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.jsonl.gz").write_bytes(gzip.compress(LOG[::-1], mtime=0))
    files, before, after = script["compress_tree"](str(tmp_path))
    assert files == 2 and before > 0 and after > 0
    assert sorted(os.listdir(tmp_path / "a")) == ["metrics.jsonl.xz"]
    assert sorted(os.listdir(tmp_path / "b")) == ["metrics.jsonl.xz"]
    assert read_record(str(tmp_path / "a" / "metrics.jsonl")) == LOG
    assert read_record(str(tmp_path / "b" / "metrics.jsonl")) == LOG[::-1]
    assert script["compress_tree"](str(tmp_path)) == (0, 0, 0)  # nothing left to convert


def test_a_log_held_twice_stops_and_keeps_both(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(LOG)
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress(LOG, mtime=0))
    with pytest.raises(SystemExit, match=r"metrics\.jsonl, metrics\.jsonl\.gz\): keep one by hand"):
        script["compress_tree"](str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "metrics.jsonl.gz"]
