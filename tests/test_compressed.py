"""Compressed records and shipped weights (credo.core.compressed): a run log stored as metrics.jsonl.xz (or an
earlier export's metrics.jsonl.gz) reads as the plain file does, the same content always compresses to the same
bytes, a damaged copy is one line naming it, and a shipped start's xz weights unpack to the exact bytes."""

from __future__ import annotations

import gzip
import json
import lzma

import pytest

from credo.core.compressed import read_record, record_bytes, unpacked_copy, xz_weights
from credo.core.config import UserError
from credo.core.files import read_jsonl
from credo.core.outputs import run_kind

ROWS = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25, "eval_accuracy": 0.75}]
TEXT = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


def test_a_compressed_log_reads_as_the_plain_one_and_the_plain_one_wins(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(str(path)) == [] and read_record(str(path)) == b""
    (tmp_path / "metrics.jsonl.xz").write_bytes(record_bytes(TEXT))
    assert read_jsonl(str(path)) == ROWS and read_record(str(path)) == TEXT
    path.write_text(json.dumps({"step": 3}) + "\n")  # a run being written appends to the plain file
    assert read_jsonl(str(path)) == [{"step": 3}]


def test_an_earlier_exports_gzip_log_is_read_and_xz_wins_over_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress(TEXT, mtime=0))
    assert read_jsonl(str(path)) == ROWS
    (tmp_path / "metrics.jsonl.xz").write_bytes(record_bytes(TEXT[:TEXT.index(b"\n") + 1]))
    assert read_jsonl(str(path)) == ROWS[:1]


def test_compression_gives_the_same_bytes_for_the_same_content():
    first, second = record_bytes(TEXT), record_bytes(bytes(TEXT))
    assert first == second and lzma.decompress(first) == TEXT
    assert record_bytes(TEXT + b"\n") != first
    log = b"".join(json.dumps({"step": k, "loss": 1 / (k + 1), "eval_accuracy": 0.5}).encode() + b"\n"
                   for k in range(400))
    assert len(record_bytes(log)) < len(gzip.compress(log, compresslevel=9, mtime=0))


def test_a_damaged_compressed_log_is_one_line_naming_it(tmp_path):
    (tmp_path / "metrics.jsonl.xz").write_bytes(record_bytes(TEXT)[:-12])  # cut short
    with pytest.raises(UserError, match=r"metrics\.jsonl\.xz: not a readable xz file") as err:
        read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert "\n" not in str(err.value)
    (tmp_path / "metrics.jsonl.xz").unlink()
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress(TEXT, mtime=0)[:-12])
    with pytest.raises(UserError, match=r"metrics\.jsonl\.gz: not a readable gzip file"):
        read_jsonl(str(tmp_path / "metrics.jsonl"))
    (tmp_path / "metrics.jsonl.gz").unlink()
    (tmp_path / "metrics.jsonl.xz").write_bytes(record_bytes(b'{"step": 1}\n{"step": \n'))
    with pytest.raises(UserError, match="metrics.jsonl:2: not valid JSON"):
        read_jsonl(str(tmp_path / "metrics.jsonl"))


@pytest.mark.parametrize("name", ["metrics.jsonl.xz", "metrics.jsonl.gz"])
def test_a_run_holding_a_compressed_log_is_a_training_run(tmp_path, name):
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "summary.json").write_text("{}\n")
    (tmp_path / name).write_bytes(record_bytes(TEXT) if name.endswith(".xz") else gzip.compress(TEXT, mtime=0))
    assert run_kind(str(tmp_path)) == "train"
    (tmp_path / "notes.txt").write_text("mine")  # a user's file: no longer recognised by its names alone
    assert run_kind(str(tmp_path)) is None


def test_a_shipped_start_unpacks_to_its_exact_bytes_and_a_second_copy_keeps_the_first(tmp_path):
    weights = bytes(range(256)) * 64
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "model.safetensors.xz").write_bytes(xz_weights(weights))
    (shipped / "policy.json").write_text('{"backend": "tiny"}\n')
    assert lzma.decompress((shipped / "model.safetensors.xz").read_bytes()) == weights
    target = tmp_path / "cache" / "sft" / "abc"
    unpacked_copy(str(shipped), str(target))
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors", "policy.json"]
    assert (target / "model.safetensors").read_bytes() == weights
    (shipped / "policy.json").write_text('{"backend": "other"}\n')
    unpacked_copy(str(shipped), str(target))  # another process got there first: its copy stays
    assert (target / "policy.json").read_text() == '{"backend": "tiny"}\n'
    assert [p.name for p in target.parent.iterdir()] == ["abc"]  # no temporary folder left behind
    (shipped / "model.safetensors.xz").write_bytes(b"not xz")
    with pytest.raises(UserError, match=r"model\.safetensors\.xz: not a readable xz file"):
        unpacked_copy(str(shipped), str(tmp_path / "elsewhere"))
    assert not (tmp_path / "elsewhere").exists()
