"""Which credo trained a run: the commit recorded in each run's summary.json.

A long comparison is resumed across sessions and machines, and its finished runs are reused whatever code is
checked out at the time. Each run therefore records the code that trained it, and a comparison whose runs
name more than one version says so in its report (a change between them that touched training would make one
table compare two programs).

The value is the last commit that changed the package itself (`git log -1 -- src/credo`), so a commit of
results or docs between two runs does not read as a new version; '+dirty' when tracked files of the package
differed from it. It is read once per process, when the first trainer is built, which is when the code that
trains was loaded: a commit made while a run trains is not the run's. An installed copy (not a tracked part
of a git checkout) records 'credo <version>'. A run resumed under another version records the one that
finished it.
"""

from __future__ import annotations

import functools
import os
import subprocess

from credo import __version__

_SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the credo package


def _git(*args: str) -> str:
    # GIT_DIR/GIT_WORK_TREE from the caller's environment would point git at another repository
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", "--no-optional-locks", *args], capture_output=True, text=True, timeout=10,
                          cwd=_SOURCE, env=env, check=True).stdout.strip()


def source_commit() -> str:
    """The last commit that changed credo's package directory, '+dirty' when its tracked files differ from it;
    'credo <version>' where the package is not tracked by git (an installed copy, even inside another
    repository) or git is missing."""
    try:
        _git("ls-files", "--error-unmatch", "__init__.py")  # the package is tracked here, not just inside a repo
        commit = _git("log", "-1", "--format=%H", "--", ".")
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return f"credo {__version__}"
    if not commit:
        return f"credo {__version__}"
    return commit + "+dirty" if dirty else commit


@functools.lru_cache(maxsize=1)
def loaded_commit() -> str:
    """source_commit() as it was the first time this process asked (the code it has loaded)."""
    return source_commit()


def short(commit: str) -> str:
    """A commit as a report shows it: its first 10 hex digits (and '+dirty'); a version string as it is."""
    if is_commit(commit):
        return commit[:10] + commit[40:]
    return commit


def is_commit(value: str) -> bool:
    """Whether a recorded version is a commit (40 hex digits, perhaps '+dirty'), not 'credo <version>'."""
    return len(value) >= 40 and all(c in "0123456789abcdef" for c in value[:40])


def package_changes(commits: list[str]) -> list[str] | None:
    """The package's files (paths inside it, sorted) that differ between any two of `commits` (recorded versions;
    a '+dirty' one counts as its commit, its uncommitted edits unknown), read from this checkout's history; None
    when git cannot tell (no commit given, a version that is not a commit, a package not tracked here, as an
    installed copy, or a commit this checkout does not hold: a shallow clone). A file that differs between two
    of them differs between the first and one of the others, so those diffs are enough."""
    if not commits or not all(is_commit(c) for c in commits):
        return None
    first, *others = sorted({c[:40] for c in commits})
    changed: set[str] = set()
    try:
        _git("ls-files", "--error-unmatch", "__init__.py")  # the package is tracked here, not just inside a repo
        _git("cat-file", "-e", f"{first}^{{commit}}")
        for other in others:
            changed.update(_git("diff", "--relative", "--name-only", first, other, "--", ".").splitlines())
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted(changed)
