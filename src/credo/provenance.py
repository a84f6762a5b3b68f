"""Which credo trained a run: the source commit recorded in each run's summary.json.

A long comparison is resumed across sessions and machines; its finished runs are reused whatever code is
checked out at the time. Each run therefore records the code that trained it, and a comparison whose runs
name more than one says so in its report (a change between them that touched training would make one table
compare two programs).
"""

from __future__ import annotations

import os
import subprocess

from credo import __version__

_SOURCE = os.path.dirname(os.path.abspath(__file__))


def source_commit() -> str:
    """The git commit of credo's source tree, '+dirty' when its tracked files under the package differ from
    it; 'credo <version>' for an installed copy outside a git checkout (or without git)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=_SOURCE,
                              check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        # only the package itself: a changed README or a result file does not change what trains
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", _SOURCE)
    except (OSError, subprocess.SubprocessError):
        return f"credo {__version__}"
    return (commit + "+dirty" if dirty else commit) if commit else f"credo {__version__}"
