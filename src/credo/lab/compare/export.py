"""`credo compare --out OUT --export DEST`: a comparison's finished runs, and its report once there is one, in
a folder small enough to commit or copy to another machine; `credo compare --out DEST` with the run's own
flags (--preset/--methods/--seeds) resumes from it.

A finished run is reused from its config.yaml, metrics.jsonl and summary.json alone (compare.run_one reads
nothing else), so only those are copied, the log xz-compressed (metrics.jsonl.xz; every reader of a run takes it as
it takes metrics.jsonl: credo.core.compressed): no weights, checkpoints or locks (a
3.2M-parameter run's checkpoint is ~40 MB, its record ~20 kB). A part-way run is left out: it resumes only from
its checkpoints, and its config and log without them would be refused as a run whose checkpoints were removed.
OUT is only read, so this is safe beside the running comparison (a run's summary.json is its last file, written
atomically; its premise checks follow it, and until they are kept the export names the run as carried without
them: export again).

DEST is missing, empty, or an earlier export (its `.credo-export` marker says so). Each new run lands whole
(written beside DEST, then renamed in); a run DEST already holds is left as it is when it is the same, and
refused, naming it, when it differs or is a live run (checkpoints, final weights). Nothing in DEST is deleted.
The report files (with estimate.json, from which `--status` costs the methods no finished run has) are
replaced by OUT's, unless DEST holds finished runs that OUT does not (runs exported from
another machine's share of the grid, or DEST's own): then OUT's report does not cover DEST, and none is copied.
With the report goes its audit/; with each finished run, and always, its premise checks (premises/<run>.json,
read back by a comparison resumed from DEST, where the weights are not).
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from typing import Callable

from tqdm import tqdm

from credo.core.compressed import XZ, read_record, record_bytes, stored_path
from credo.core.config import UserError
from credo.core.files import atomic_copy, atomic_directory, atomic_write_text, is_within
from credo.core.outputs import KIND_MARKER, is_locked, run_kind
from credo.core.terminal import escape_controls
from credo.lab.compare.premises import PENDING

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")
"""What a finished run is reused from."""
COMPRESSED_FILES = ("metrics.jsonl",)
"""The run files an export stores xz-compressed (name + .xz): the log is most of a run's record."""
REPORT_FILES = ("results.json", "report.md", "*.png", "failure-*.txt", "estimate.json")
"""A comparison's own files beside runs/ (its audit/ is copied too; premises/ goes with the runs)."""
EXPORT_MARKER = ".credo-export"
"""Marks a folder --export wrote, which a later export may add to."""


@dataclass
class Exported:
    """What an export did: runs copied, runs DEST already held, part-way runs and incomplete ones left out."""

    copied: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    part_way: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    only_in_dest: list[str] = field(default_factory=list)
    """Finished runs DEST holds that OUT does not (another machine's share): then no report is copied."""
    checks_pending: list[str] = field(default_factory=list)
    """Finished runs exported whose premise checks were not measured yet (premises/<run>.pending)."""
    report: bool = False


def check_dest(out_dir: str, dest: str, flag: str = "--export", fresh: bool = False) -> None:
    """DEST may take an export of OUT: missing, empty or an earlier export, and apart from OUT; else one line naming
    `flag`. Also asked before a comparison with compare.export_each trains, while OUT may not exist yet; `fresh`
    (--force: OUT starts again) refuses an earlier export's finished runs, which the new runs would contradict."""
    if is_within(dest, out_dir) or is_within(out_dir, dest):
        raise UserError(f"{flag} {dest} is --out {out_dir} or holds it or lies inside it; choose a folder apart")
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise UserError(f"{flag} {dest} is a file, not a directory; nothing was touched")
    if os.path.isdir(dest) and os.listdir(dest):
        if not os.path.isfile(os.path.join(dest, EXPORT_MARKER)):
            raise UserError(f"{flag} {dest} is not empty and is not an earlier credo export; nothing was touched "
                            "(choose a new or empty folder)")
        if is_locked(dest):
            raise UserError(f"{flag} {dest} is being written by a credo compare; stop it first (nothing was touched)")
        held = os.path.join(dest, "runs")
        if fresh and os.path.isdir(held) and any(os.path.isfile(os.path.join(held, n, "summary.json"))
                                                 for n in os.listdir(held)):
            raise UserError(f"{flag} {dest} holds finished runs of an earlier export, and --force starts --out "
                            "afresh: its new runs would not match them; choose a new or empty folder")


def _same_run(source: str, target: str) -> bool:
    """Whether DEST's run `target` is a finished record identical to OUT's `source` (a log compared by its content,
    compressed or not)."""
    return all(_present(target, f) and read_record(os.path.join(source, f)) == read_record(os.path.join(target, f))
               for f in RUN_FILES)


def export(out_dir: str, dest: str, flag: str = "--export") -> Exported:
    """Copies out_dir's finished runs (RUN_FILES each) and its report files into dest; returns what it did. flag:
    the option that named dest, which a refusal names."""
    if not os.path.isdir(out_dir) or run_kind(out_dir) != "compare":
        raise UserError(f"--out {out_dir} is not a credo comparison (no results.json nor runs/ of training runs)")
    check_dest(out_dir, dest, flag)
    runs = os.path.join(out_dir, "runs")
    names = sorted(n for n in os.listdir(runs) if os.path.isdir(os.path.join(runs, n))) if os.path.isdir(runs) else []
    done, todo = Exported(), []
    for name in names:  # every refusal before anything is written
        run, target = os.path.join(runs, name), os.path.join(dest, "runs", name)
        if not os.path.isfile(os.path.join(run, "summary.json")):
            if os.path.isfile(os.path.join(run, "config.yaml")):
                done.part_way.append(name)
            continue
        if not all(_present(run, f) for f in RUN_FILES):
            done.incomplete.append(name)
            continue
        if os.path.exists(target):
            if _same_run(run, target):
                done.kept.append(name)
                continue
            live = [f for f in ("checkpoints", "final") if os.path.exists(os.path.join(target, f))]
            why = f"is a live run ({', '.join(live)})" if live else "differs from --out's"
            raise UserError(f"{flag} {dest}: its runs/{name} {why}; nothing was written (export elsewhere)")
        todo.append(name)
    os.makedirs(dest, exist_ok=True)
    atomic_write_text(os.path.join(dest, KIND_MARKER), "compare\n")
    atomic_write_text(os.path.join(dest, EXPORT_MARKER), "an export of a credo comparison (credo compare --export)\n")
    for name in todo:
        with atomic_directory(os.path.join(dest, "runs", name)) as tmp:  # the run lands whole or not at all
            for f in RUN_FILES:
                _copy_run_file(os.path.join(runs, name, f), tmp)
            atomic_write_text(os.path.join(tmp, KIND_MARKER), "train\n")
        done.copied.append(name)
    finished = set(done.copied) | set(done.kept)
    premises = os.path.join(out_dir, "premises")  # each run's own premise checks go with it, report or not
    for entry in sorted(os.listdir(premises)) if os.path.isdir(premises) else []:
        if entry.endswith(".json") and entry[:-len(".json")] in finished | {"start"}:
            atomic_copy(os.path.join(premises, entry), os.path.join(dest, "premises", entry))
    done.checks_pending = sorted(n for n in finished if os.path.exists(os.path.join(premises, n + PENDING)))
    held = os.path.join(dest, "runs")
    done.only_in_dest = sorted(n for n in os.listdir(held) if n not in finished and
                               os.path.isfile(os.path.join(held, n, "summary.json"))) if os.path.isdir(held) else []
    if done.only_in_dest:  # DEST has more than OUT's report covers: its own report is not OUT's to replace
        return done
    for entry in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, entry)
        if os.path.isfile(path) and any(fnmatch.fnmatchcase(entry, p) for p in REPORT_FILES):
            atomic_copy(path, os.path.join(dest, entry))
            done.report = done.report or entry == "results.json"
    audit = os.path.join(out_dir, "audit")
    if os.path.isdir(audit):
        for entry in sorted(os.listdir(audit)):
            if os.path.isfile(os.path.join(audit, entry)) and not entry.startswith("."):
                atomic_copy(os.path.join(audit, entry), os.path.join(dest, "audit", entry))
    return done


def _present(run: str, name: str) -> bool:
    """Whether the run file `name` is in `run`: a log also as its compressed copy (an earlier export's)."""
    path = os.path.join(run, name)
    return stored_path(path) is not None if name in COMPRESSED_FILES else os.path.isfile(path)


def _copy_run_file(source: str, folder: str) -> None:
    """Copies the run file `source` into `folder`: a log xz-compressed (from the plain file or an earlier
    export's compressed copy, .xz or .gz), anything else as it is."""
    name = os.path.basename(source)
    if name not in COMPRESSED_FILES:
        shutil.copyfile(source, os.path.join(folder, name))
        return
    with open(os.path.join(folder, name + XZ), "wb") as f:
        f.write(record_bytes(read_record(source)))


def describe(done: Exported, dest: str) -> str:
    """One line for the terminal."""
    text = f"exported {len(done.copied)} finished run(s) to {dest}"
    if done.kept:
        text += f" ({len(done.kept)} more already there)"
    if done.part_way:
        text += (f"; left out {len(done.part_way)} part-way ({', '.join(done.part_way)}): they resume only where "
                 "their checkpoints are")
    if done.incomplete:
        text += (f"; left out {len(done.incomplete)} with a summary.json but no config.yaml or metrics.jsonl "
                 f"({', '.join(done.incomplete)})")
    if done.checks_pending:
        text += (f"; {', '.join(done.checks_pending)} went without its premise checks, not measured yet (or "
                 "interrupted: the comparison measures them when it goes on): export again once they are")
    if done.only_in_dest:
        text += (f"; the report was not copied, since {dest} holds {len(done.only_in_dest)} finished run(s) that "
                 f"--out does not ({', '.join(done.only_in_dest[:4])}{', ...' if len(done.only_in_dest) > 4 else ''})")
    elif done.report:
        text += "; with the report"
    return text


def exporter(out_dir: str, dest: str) -> Callable[[], None]:
    """compare.export_each: what exports OUT into DEST after each run a comparison finishes, and once more after
    its report, saying what it did in one line. A refused export (DEST changed meanwhile) or a failed write is
    said, never raised: the comparison goes on, and `--export DEST` can be run again by hand."""
    def export_now() -> None:
        try:
            said = describe(export(out_dir, dest, "--export-each"), dest)
        except (UserError, OSError) as err:
            by_hand = shlex.join(["credo", "compare", "--out", out_dir, "--export", dest])
            said = f"export to {dest} failed ({err}); the comparison goes on: `{by_hand}` exports it by hand"
        tqdm.write(f"credo compare: {escape_controls(said)}", file=sys.stderr)
    return export_now
