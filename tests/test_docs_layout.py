"""docs/architecture.md names the code as it is: every module is in its Layout section, and every file it points
to (the files to copy) exists."""

from __future__ import annotations

import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")
PACKAGE = os.path.join(ROOT, "src", "credo")


def layout_block() -> str:
    page = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    section = page.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_readme_layout_names_every_module():
    block = layout_block()
    words = set(re.findall(r"[\w.]+", block))
    missing = []
    for name in sorted(os.listdir(PACKAGE)):
        path = os.path.join(PACKAGE, name)
        if name.endswith(".py") and name != "__init__.py" and name not in words:
            missing.append(name)
        elif os.path.isdir(path) and os.path.exists(os.path.join(path, "__init__.py")):
            if f"{name}/" not in block:
                missing.append(f"{name}/")
            for inner in sorted(os.listdir(path)):
                stem = inner[:-3]
                if inner.endswith(".py") and inner != "__init__.py" and stem not in words and inner not in words \
                        and not any(w.endswith("*.py") and stem.startswith(w[:-4]) for w in block.split()):
                    missing.append(f"{name}/{inner}")
    assert not missing, f"docs/architecture.md's Layout does not name: {missing}"


def test_architecture_page_points_to_files_that_exist():
    page = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    paths = set(re.findall(r"[\w/]+\.(?:py|md)\b", page))
    assert {"credit/outcome.py", "strategies/sampling.py", "tasks/jsonl.py", "policy/tiny.py"} <= paths
    files = {os.path.relpath(os.path.join(d, f), ROOT) for top in ("src", "tests", "docs", "bench")
             for d, _, names in os.walk(os.path.join(ROOT, top)) for f in names}
    for path in paths:  # a path may be relative to the package or to the row's folder (`tiny.py` under policy/)
        assert any(f == path or f.endswith("/" + path) for f in files), f"docs/architecture.md names {path}, which does not exist"
