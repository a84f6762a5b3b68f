"""Files credo keeps compressed, and how they are read back.

- A run's metrics log in a committed or exported comparison: `metrics.jsonl.xz` beside where `metrics.jsonl` would
  be (xz, ~6.5x smaller; gzip's `metrics.jsonl.gz`, ~5x, is what earlier exports wrote, and is still read). Every
  reader of a run record takes each form (`read_record`); a run being trained writes the plain file, which wins
  when more than one is present.
- The weights of the SFT starts shipped in the package: `model.safetensors.xz` (~15% smaller than the raw float32
  tensors; gzip saves ~7%), unpacked once into credo's cache (credo.train.sft.ensure_sft).

All are standard formats (`xz -d`, `zcat` read them) and written without a timestamp or a file name, so the same
content always gives the same bytes.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import tempfile
import zlib

from credo.core.config import UserError

XZ = ".xz"
"""Suffix of a record's compressed copy (metrics.jsonl -> metrics.jsonl.xz) and of a shipped start's compressed
weights (model.safetensors -> model.safetensors.xz)."""
GZIP = ".gz"
"""Suffix of a record's compressed copy as earlier exports stored it (metrics.jsonl.gz): read, no longer written."""
RECORD_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
"""LZMA2 at its strongest: the committed logs are JSON text, ~20% smaller than gzip at level 9 makes them."""
WEIGHT_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "lc": 0, "lp": 2, "pb": 2}]
"""LZMA2 told that the data comes in 4-byte units (float32): its exponent bytes then compress."""


def stored_path(path: str) -> str | None:
    """The file that holds the record `path`: `path` itself, else its compressed copy `path.xz`, else an earlier
    export's `path.gz`; None when none exists."""
    for candidate in (path, path + XZ, path + GZIP):
        if os.path.isfile(candidate):
            return candidate
    return None


def read_record(path: str) -> bytes:
    """The bytes of the record `path`, read from itself or decompressed from `path.xz` or `path.gz` (b'' when none
    exists). A damaged compressed copy is one line naming it."""
    stored = stored_path(path)
    if stored is None:
        return b""
    if stored == path:
        with open(stored, "rb") as f:
            return f.read()
    if stored.endswith(XZ):
        return unxz(stored)
    try:
        with gzip.open(stored, "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise UserError(f"{stored}: not a readable gzip file ({err})") from None


def record_bytes(data: bytes) -> bytes:
    """A record's bytes as its compressed copy stores them: xz with RECORD_FILTERS and a SHA-256 check (the format
    has no timestamp or file name: the same data, the same bytes)."""
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_SHA256, filters=RECORD_FILTERS)


def xz_weights(data: bytes) -> bytes:
    """A weights file xz-compressed with WEIGHT_FILTERS (no timestamp in the format: the same data, the same bytes)."""
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_SHA256, filters=WEIGHT_FILTERS)


def unxz(source: str) -> bytes:
    """The content of the xz file `source` (its SHA-256 check verified); a damaged file is one line naming it."""
    try:
        with open(source, "rb") as f:
            return lzma.decompress(f.read(), format=lzma.FORMAT_XZ)
    except lzma.LZMAError as err:
        raise UserError(f"{source}: not a readable xz file ({err})") from None


def unpacked_copy(source: str, destination: str) -> None:
    """Copies the folder `source` to `destination` (a new folder), each `name.xz` in it decompressed to `name`.
    The copy appears whole under its name or not at all; when another process made the same copy at once (the
    destination exists), the first stays and this one is dropped."""
    parent = os.path.dirname(os.path.abspath(destination))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(destination)}-", dir=parent)
    try:
        for name in sorted(os.listdir(source)):
            if name.endswith(XZ):
                with open(os.path.join(tmp, name[:-len(XZ)]), "wb") as f:
                    f.write(unxz(os.path.join(source, name)))
            else:
                shutil.copyfile(os.path.join(source, name), os.path.join(tmp, name))
        try:
            os.rename(tmp, destination)
        except OSError:
            if not os.path.isdir(destination):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
