"""Run directories: atomic writes, metrics JSONL, checkpoint bookkeeping.

Nothing is written in place: a file or checkpoint directory appears under its final name only
once it is complete, so a run killed at any moment leaves its last good state readable.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import os
import shutil
import tempfile
import warnings
from typing import Any, Callable, Iterator

from credo.core.compressed import GZIP, read_record, stored_path
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
    """Rows of a JSONL file, or of its compressed copy `path.gz` (credo.core.compressed). A line that is not JSON
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


KIND_MARKER = ".credo-kind"
RUN_LOCK = ".credo-lock"
# files that identify a run directory written before the marker existed
_SIGNATURES = {"train": ("config.yaml", "metrics.jsonl"), "sft": ("sft_config.yaml", "policy.json"),
               "audit": ("audit.json",), "compare": ("results.json",)}
# every name credo writes into an output of that kind: a directory holding anything else holds a user's
# files too, and is never taken for (or replaced as) a credo output by its file names alone
# (tensorboard/, wandb/, mlruns/: the local stores of the trackers a run or comparison reports to)
_TRACKER_DIRS = ("tensorboard", "wandb", "mlruns")
_OWN_NAMES = {"train": ("config.yaml", "metrics.jsonl", "metrics.jsonl" + GZIP, "summary.json", "checkpoints", "final",
                        "credit", *_TRACKER_DIRS),
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
    import fcntl  # POSIX only: imported where a lock is taken or read
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
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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


def is_locked(run_dir: str) -> bool:
    """Whether another process holds `run_dir`'s run_lock now (False where the file system has no locks)."""
    import fcntl  # POSIX only: imported where a lock is taken or read
    path = os.path.join(run_dir, RUN_LOCK)
    if not os.path.isfile(path):
        return False
    try:
        fd = os.open(path, os.O_RDWR)  # NFS emulates flock with POSIX locks, which need a writable descriptor
    except OSError as err:
        if err.errno in _NO_LOCKS:
            return False
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError as err:
        if err.errno in _NO_LOCKS:
            return False
        raise
    finally:
        os.close(fd)


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
