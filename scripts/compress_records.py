"""Stores the run logs under the given folders compressed, as `credo compare --export` writes them: each
metrics.jsonl becomes metrics.jsonl.gz (gzip at level 9 with mtime 0, so the same log always gives the same bytes),
which every credo command reads as it reads the plain file (credo.core.compressed). For a result committed from a
folder that was not written by --export; the plain file is removed only once its compressed copy reads back
byte for byte.

    python scripts/compress_records.py docs/results/NAME [...]
"""

from __future__ import annotations

import gzip
import os
import sys

from credo.core.compressed import GZIP, gzip_bytes

RECORD = "metrics.jsonl"


def compress_tree(root: str) -> tuple[int, int, int]:
    """(files, bytes before, bytes after) of compressing every RECORD under `root`."""
    files = before = after = 0
    for folder, _, names in sorted(os.walk(root)):
        if RECORD not in names:
            continue
        path = os.path.join(folder, RECORD)
        with open(path, "rb") as f:
            data = f.read()
        if os.path.exists(path + GZIP):
            sys.exit(f"{path}{GZIP} exists already: remove one of the two by hand")
        packed = gzip_bytes(data)
        with open(path + GZIP, "wb") as f:
            f.write(packed)
        with gzip.open(path + GZIP, "rb") as f:
            if f.read() != data:
                sys.exit(f"{path}{GZIP} does not read back as {path}; both kept")
        os.remove(path)
        files, before, after = files + 1, before + len(data), after + len(packed)
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
        print(f"{root}: {files} {RECORD} compressed, {before:,} -> {after:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
