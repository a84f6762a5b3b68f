"""Whose folder an output is, and what may replace it: each command marks the --out it writes (KIND_MARKER) and
claims it before writing (`claim_output`: `--force` replaces only a folder of credo's own files, never an input, the
home directory, the cache or a mount point), and a run directory is held by one process at a time (`run_lock`)."""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import shutil
import tempfile
import time
import warnings
from typing import Iterator

from credo.core.compressed import GZIP, XZ, stored_path
from credo.core.config import UserError
from credo.core.files import atomic_write_text, cache_root, is_within

KIND_MARKER = ".credo-kind"
RUN_LOCK = ".credo-lock"
# files that identify a run directory written before the marker existed
_SIGNATURES = {"train": ("config.yaml", "metrics.jsonl"), "sft": ("sft_config.yaml", "policy.json"),
               "audit": ("audit.json",), "compare": ("results.json",)}
# every name credo writes into an output of that kind: a directory holding anything else holds a user's
# files too, and is never taken for (or replaced as) a credo output by its file names alone
# (tensorboard/, wandb/, mlruns/: the local stores of the trackers a run or comparison reports to)
_TRACKER_DIRS = ("tensorboard", "wandb", "mlruns")
_OWN_NAMES = {"train": ("config.yaml", "metrics.jsonl", "metrics.jsonl" + XZ, "metrics.jsonl" + GZIP, "summary.json",
                        "checkpoints", "final", "credit", *_TRACKER_DIRS),
              "audit": ("audit.json", "localisers.json", "audit.md", "audit.png", "audit.html"),
              "compare": ("results.json", "report.md", "*.png", "runs", "audit", "premises", "failure-*.txt",
                          ".credo-export", "estimate.json", *_TRACKER_DIRS),
              "bookkeeping": ()}  # (no output's own names: _ALWAYS_OWN alone)
# credo's bookkeeping, and what file systems and desktops leave in any folder (NFS's silly-renamed files,
# macOS's .DS_Store): none of it is a user's work
_ALWAYS_OWN = (KIND_MARKER, RUN_LOCK, ".tmp-*", ".DS_Store", ".nfs*")
NOTES = ("README*",)  # a note beside an output: does not make it someone else's folder, but is never deleted


def foreign_entries(path: str, kind: str, notes: bool = False) -> list[str]:
    """The entries of directory `path` that are not names credo writes into a `kind` output (with `notes`,
    a README beside them is not counted), sorted."""
    allowed = _OWN_NAMES.get(kind, ("*",)) + _ALWAYS_OWN + (NOTES if notes else ())  # (sft, show: anything)
    return sorted(e for e in os.listdir(path) if not any(fnmatch.fnmatchcase(e, pattern) for pattern in allowed))


def holds_only_own_files(path: str, kind: str, notes: bool = False) -> bool:
    """Whether every entry of directory `path` is a name credo writes into a `kind` output (with `notes`,
    a README beside them too: enough to recognise an output, not to delete the folder)."""
    return not foreign_entries(path, kind, notes)


def run_kind(path: str) -> str | None:
    """'train', 'sft', 'audit' or 'compare' if `path` is a credo output directory of that kind, else None.
    Its marker says so; a directory from before the marker counts by its files only when it holds
    nothing else."""
    marker = os.path.join(path, KIND_MARKER)
    if os.path.isfile(marker):
        with open(marker) as f:
            return f.read().strip() or None
    for kind, files in _SIGNATURES.items():
        if (all(os.path.exists(os.path.join(path, name)) or stored_path(os.path.join(path, name)) for name in files)
                and holds_only_own_files(path, kind, notes=True)):
            return kind
    runs = os.path.join(path, "runs")  # a comparison stopped before its first result
    if (os.path.isdir(runs) and os.listdir(runs) and holds_only_own_files(path, "compare", notes=True)
            and all(run_kind(os.path.join(runs, r)) == "train" for r in os.listdir(runs))):
        return "compare"
    if os.path.isfile(os.path.join(path, "estimate.json")) and holds_only_own_files(path, "compare", notes=True):
        return "compare"  # ... or before its first run had logged anything
    return None


def _protected(path: str, inputs: tuple[str, ...]) -> str | None:
    """What replacing directory `path` would delete that the command must not: one of its inputs, the
    current directory, credo's cache or the home directory (None if nothing)."""
    named = [(p, f"the input {p}") for p in inputs if p and os.path.exists(p)]
    for given, what in named + [(os.getcwd(), "the current directory"), (cache_root(), "credo's cache"),
                                (os.path.expanduser("~"), "the home directory")]:
        if is_within(given, path):
            return what
    return None


def replace_refusal(path: str, inputs: tuple[str, ...] = ()) -> str | None:
    """Why `--force` must not replace the non-empty directory `path` (None: it may). It replaces only a
    credo output holding nothing credo did not write (or a folder of credo's bookkeeping alone), and never
    one that is or holds an input, the current directory, the cache or the home directory, nor a
    file-system root or mount point (a whole disk), nor a run another process is writing."""
    kept = _protected(path, inputs)
    if kept:
        return f"is or holds {kept}, which --force would delete; choose another --out"
    if os.path.ismount(os.path.realpath(path)):
        return "is a file-system root or mount point, which --force never replaces; choose another --out"
    if is_locked(path):
        return "is being written by another credo process; stop it first"
    if foreign_entries(path, "bookkeeping"):  # a folder of credo's bookkeeping alone (a lock, a marker) holds nothing
        found = run_kind(path)
        if found is None:
            return ("is not a credo output directory, and --force replaces only what credo wrote; choose another "
                    "--out, or empty it yourself")
        foreign = foreign_entries(path, found)
        if foreign:
            return (f"holds {foreign[0]}, which credo did not write, beside a credo {found} output; --force "
                    "replaces only what credo wrote (move it away, or choose another --out)")
    return None


def enclosing_output(path: str) -> str | None:
    """The credo output or checkpoint that `path` would lie inside (None if none): an output written there
    would change it (a checkpoint's manifest no longer matches, a run holds a folder credo did not write),
    and the run could no longer resume."""
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            if os.path.isfile(os.path.join(folder, "manifest.json")):
                return f"the credo checkpoint {folder}"
            found = run_kind(folder)
        except OSError:  # an ancestor this user may not read: not credo's output
            found = None
        if found:
            return f"the credo {found} output {folder}"
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def claim_output(path: str, kind: str, force: bool = False, inputs: tuple[str, ...] = ()) -> bool:
    """Make `path` ready to hold a `kind` output; returns True if it already holds one (to continue or redo).

    A missing or empty directory is created and marked; one inside another credo output or checkpoint is
    refused. A non-empty directory of another kind (or none) is refused, untouched, unless `force`: then,
    if `replace_refusal` allows it, it is first renamed aside (one atomic step) and removed, so `path`
    never holds a half-deleted mix of old and new files.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--out {path} is a file, not a directory; nothing was touched")
    inside = enclosing_output(path)
    if inside:
        raise UserError(f"--out {path} lies inside {inside}, which writing there would change (a run could no "
                        "longer resume); choose an --out outside it (nothing was touched)")
    if os.path.isdir(path) and os.listdir(path):
        if force:
            refusal = replace_refusal(path, inputs)
            if refusal:
                raise UserError(f"--out {path} {refusal} (nothing was touched)")
            aside = tempfile.mkdtemp(prefix=".replaced-" + os.path.basename(os.path.abspath(path)) + "-",
                                     dir=os.path.dirname(os.path.abspath(path)))
            os.rename(path, os.path.join(aside, "old"))
            shutil.rmtree(aside, ignore_errors=True)
        else:
            found = run_kind(path)
            if found == kind:
                return True
            what = f"holds a credo {found} output" if found else "is not a credo output directory"
            how = "pass --force to replace it" if found else "--force replaces only a credo output"
            raise UserError(f"--out {path} is not empty and {what}, not a {kind} run; nothing was touched "
                            f"(choose another --out, or {how})")
    os.makedirs(path, exist_ok=True)
    atomic_write_text(os.path.join(path, KIND_MARKER), kind + "\n")
    return False


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EACCES, errno.EROFS)


def _warn_unlocked(run_dir: str, err: OSError) -> None:
    warnings.warn(f"{run_dir}: this file system gives no lock ({err.strerror}); a second process writing the same "
                  "directory would not be stopped", stacklevel=3)


@contextlib.contextmanager
def run_lock(run_dir: str) -> Iterator[None]:
    """Hold an exclusive lock on `run_dir` while a process writes it: a second `credo train` (or a resume, or
    a --force replacement) of the same directory is refused instead of interleaving with the first. The lock
    is the kernel's (flock), so a killed process releases it. On a file system without locks (some NFS
    mounts) the directory is written unlocked, with a warning, as before locks existed."""
    os.makedirs(run_dir, exist_ok=True)
    try:
        fd = os.open(os.path.join(run_dir, RUN_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        if err.errno not in _NO_LOCKS:
            raise
        _warn_unlocked(run_dir, err)
        yield
        return
    try:
        try:
            _flock_patiently(fd)
        except BlockingIOError:
            raise UserError(f"{run_dir} is being written by another credo process; "
                            "wait for it or stop it first") from None
        except OSError as err:
            if err.errno not in _NO_LOCKS:
                raise
            _warn_unlocked(run_dir, err)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


LOCK_PATIENCE = 1.0
"""Seconds run_lock waits for a lock held by someone else before it refuses: lock_held takes the lock for an
instant to test it (`credo compare --status`, an export), which must not make a trainer starting then fail."""


def _flock_patiently(fd: int) -> None:
    """Takes the exclusive lock of `fd`, retrying for LOCK_PATIENCE seconds; then BlockingIOError."""
    import fcntl  # POSIX only: imported where a lock is taken or read
    waited = 0.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if waited >= LOCK_PATIENCE:
                raise
        time.sleep(0.05)
        waited += 0.05


def lock_held(run_dir: str) -> bool | None:
    """Whether another process holds `run_dir`'s run_lock now: True, False, or None where it cannot be told (a
    file system without locks; a lock file this user cannot open). Tested by taking the lock for an instant, which
    run_lock waits out (LOCK_PATIENCE)."""
    import fcntl  # POSIX only: imported where a lock is taken or read
    path = os.path.join(run_dir, RUN_LOCK)
    if not os.path.isfile(path):
        return False
    try:
        fd = os.open(path, os.O_RDWR)  # NFS emulates flock with POSIX locks, which need a writable descriptor
    except FileNotFoundError:  # removed since (a --force replacement)
        return False
    except OSError as err:
        if err.errno in _NO_LOCKS:
            return None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError as err:
        if err.errno in _NO_LOCKS:
            return None
        raise
    finally:
        os.close(fd)


def is_locked(run_dir: str) -> bool:
    """Whether another process holds `run_dir`'s run_lock now (False where that cannot be told: lock_held)."""
    return lock_held(run_dir) is True
