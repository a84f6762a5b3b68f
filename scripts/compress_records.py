"""Stores the run logs under the given folders compressed, as `credo compare --export` writes them: each
metrics.jsonl, and each metrics.jsonl.gz an earlier export wrote, becomes metrics.jsonl.xz (credo.core.compressed:
the same log always gives the same bytes), which every credo command reads as it reads the plain file. For a
result committed from a folder that was not written by --export, or written before exports used xz; the older
file is removed only once the new copy reads back byte for byte as it.

    python scripts/compress_records.py docs/results/NAME [...]
"""

from __future__ import annotations

import os
import sys

from credo.core.compressed import GZIP, XZ, read_record, record_bytes, unxz
from credo.core.files import atomic_write_with

RECORD = "metrics.jsonl"


def compress_tree(root: str) -> tuple[int, int, int]:
    """(files, bytes before, bytes after) of storing every RECORD under `root` as RECORD.xz."""
    files = before = after = 0
    for folder, _, names in sorted(os.walk(root)):
        older = [name for name in (RECORD, RECORD + GZIP) if name in names]
        if not older:
            continue
        path = os.path.join(folder, RECORD)
        copies = [name for name in (RECORD, RECORD + XZ, RECORD + GZIP) if name in names]
        if len(copies) > 1:
            sys.exit(f"{path}: more than one copy of the log ({', '.join(copies)}): keep one by hand")
        source = os.path.join(folder, older[0])
        data = read_record(path)
        packed = record_bytes(data)

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(packed)

        atomic_write_with(path + XZ, write)  # the copy appears whole, or not at all
        if unxz(path + XZ) != data:
            sys.exit(f"{path}{XZ} does not read back as {source}; both kept")
        stored = os.path.getsize(source)
        os.remove(source)
        files, before, after = files + 1, before + stored, after + len(packed)
    return files, before, after


def main(roots: list[str]) -> int:
    if not roots:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for root in roots:
        if not os.path.isdir(root):
            print(f"{root}: not a folder", file=sys.stderr)
            return 2
    for root in roots:
        files, before, after = compress_tree(root)
        print(f"{root}: {files} {RECORD} stored as {RECORD}{XZ}, {before:,} -> {after:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
