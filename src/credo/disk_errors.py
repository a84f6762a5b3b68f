"""Writes the machine refused (a full disk, a quota, a read-only file system) as one-line user errors.

These are the machine's state, which the user fixes, not bugs, so every command reports them as one line
naming where (exit 2) instead of a traceback; a comparison stops on one instead of recording it as the
failure of each method it tries next. They arrive as an OSError from Python's own writes, and as a
SafetensorError from safetensors' Rust writer (checkpoints, weights), which carries the errno only in its
text ("... No space left on device (os error 28)").
"""

from __future__ import annotations

import errno
import os
import re

from credo.config import UserError

DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class DiskError(UserError):
    """A write the machine refused; the message names where and says what to do."""


def disk_errno(err: BaseException) -> int | None:
    """The errno of `err` if it is a refused write (one of DISK_ERRNOS), else None."""
    if isinstance(err, OSError):
        code = err.errno
    else:
        match = _RUST_OS_ERROR.search(str(err))
        code = int(match.group(1)) if match else None
    return code if code in DISK_ERRNOS else None


def is_disk_error(err: BaseException) -> bool:
    return isinstance(err, DiskError) or disk_errno(err) is not None


def as_disk_error(err: BaseException, then: str = ", then rerun") -> DiskError:
    """`err` (is_disk_error) as a DiskError naming the file it was writing where Python knows it (for a copy,
    filename2 is the destination, filename the source), ending with `then` (what to do once it is fixed)."""
    if isinstance(err, DiskError):
        return err
    code = disk_errno(err)
    where = (getattr(err, "filename2", None) or getattr(err, "filename", None)) if isinstance(err, OSError) else None
    place = f": {where}" if where else " where the command writes (its --out, or credo's cache)"
    return DiskError(f"{os.strerror(code or errno.ENOSPC)}{place}; free space or write access there{then}")
