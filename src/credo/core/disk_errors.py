"""Writes the machine refused (a full disk, a quota, a read-only file system, a file-size limit) as one-line
user errors.

These are the machine's state, which the user fixes, not bugs, so every command reports them as one line
naming where (exit 2) instead of a traceback, and a comparison stops on one instead of recording it as the
failure of each method it tries next. They arrive as an OSError from Python's own writes (which names the
file only when open() fails, never when write() does: runs.py's write primitives add it with
`named_disk_errors`), and as a SafetensorError from safetensors' Rust writer (checkpoints, weights), which
carries the errno only in its text ("... No space left on device (os error 28)").
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from typing import Iterator

from credo.core.config import UserError

# EFBIG: a file grew past the process's file-size limit (`ulimit -f`, a batch scheduler's RLIMIT_FSIZE); Python
# ignores the SIGXFSZ that would otherwise kill the process, so the write fails with it instead
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_RUST_PATH = re.compile(r'at path "([^"]+)"')
_ADVICE = {errno.ENOSPC: "free space there", errno.EDQUOT: "free space within your quota",
           errno.EROFS: "make it writable, or write elsewhere",
           errno.EFBIG: "raise the file-size limit (ulimit -f), or write elsewhere"}


class DiskError(UserError):
    """A write the machine refused: `core` names where and what to do, `then` how to go on once it is done
    (a command that knows better, like `credo train`, swaps it for its own with `with_then`)."""

    def __init__(self, core: str, then: str = ", then rerun") -> None:
        super().__init__(core + then)
        self.core, self.then = core, then

    def __reduce__(self):  # pickled by a comparison's worker process: rebuilt from its parts, not its text
        return type(self), (self.core, self.then)

    def with_then(self, then: str) -> "DiskError":
        return type(self)(self.core, then)


def disk_errno(err: BaseException) -> int | None:
    """The errno of `err` if it is a refused write (one of DISK_ERRNOS) not yet made a DiskError, else None. A
    credo UserError never has one (its text may quote a row that happens to read "(os error 28)")."""
    if isinstance(err, UserError):
        return None
    if isinstance(err, OSError):
        code = err.errno
    else:
        match = _RUST_OS_ERROR.search(str(err))
        code = int(match.group(1)) if match else None
    return code if code in DISK_ERRNOS else None


def is_disk_error(err: BaseException) -> bool:
    return isinstance(err, DiskError) or disk_errno(err) is not None


def as_disk_error(err: BaseException, then: str = ", then rerun", where: str | None = None) -> DiskError:
    """`err` (is_disk_error) as a DiskError naming the file it was writing: the one Python names (for a copy,
    filename2 is the destination, filename the source), else `where`, else the directory of safetensors'
    temporary file; ending with `then` (what to do once it is fixed)."""
    if isinstance(err, DiskError):
        return err.with_then(then)
    code = disk_errno(err) or errno.ENOSPC  # (an err that is not one: called on a guess, say the commonest)
    named = (getattr(err, "filename2", None) or getattr(err, "filename", None)) if isinstance(err, OSError) else None
    rust_path = _RUST_PATH.search(str(err))
    place = named or where or (os.path.dirname(rust_path.group(1)) if rust_path else None)
    at = f": {place}" if place else " where the command writes (its --out, or credo's cache)"
    return DiskError(f"{os.strerror(code)}{at}; {_ADVICE[code]}", then)


@contextlib.contextmanager
def named_disk_errors(path: str) -> Iterator[None]:
    """Re-raises a refused write inside the block as a DiskError naming `path` (unless it names its own file)."""
    try:
        yield
    except DiskError:
        raise
    except Exception as err:
        if not is_disk_error(err):
            raise
        raise as_disk_error(err, where=path) from err
