"""docs/architecture.md describes the code as it is: every module is named in its Layout section, every file it
names exists, and the layers it states are the ones tests/test_architecture.py enforces."""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..")
PACKAGE = os.path.join(ROOT, "src", "credo")
PAGE = os.path.join(ROOT, "docs", "architecture.md")


def layout_block() -> str:
    page = open(PAGE).read()
    section = page.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_the_layout_names_every_package_and_module():
    block = layout_block()
    words = set(re.findall(r"[\w.]+", block))
    missing = []
    for folder, _, files in os.walk(PACKAGE):
        rel = os.path.relpath(folder, PACKAGE)
        if "__init__.py" not in files:
            continue
        if rel != "." and f"{os.path.basename(rel)}/" not in block:
            missing.append(f"{rel}/")
        for name in files:
            if name.endswith(".py") and name not in ("__init__.py", "__main__.py") \
                    and name not in words and name[:-3] not in words:
                missing.append(os.path.join(rel, name))
    assert missing == [], f"docs/architecture.md's Layout does not name: {missing}"


def test_every_file_the_page_names_exists():
    page = open(PAGE).read()
    paths = set(re.findall(r"[\w/]+\.(?:py|md)\b", page))
    assert {"credit/outcome.py", "strategies/sampling.py", "tasks/jsonl.py", "policy/tiny.py", "train/step.py"} <= paths
    tops = ("src", "tests", "docs", "bench", "scripts", "examples")
    files = {os.path.relpath(os.path.join(d, f), ROOT) for top in tops
             for d, _, names in os.walk(os.path.join(ROOT, top)) for f in names}
    for path in paths:  # relative to the package or to the row's folder (`tiny.py` under policy/)
        assert any(f == path or f.endswith("/" + path)
                   for f in files), f"docs/architecture.md names {path}, which does not exist"


def enforced_layers() -> list[list[str]]:
    """LAYERS of tests/test_architecture.py, read from its source (a test module is not imported by another)."""
    tree = ast.parse(open(os.path.join(os.path.dirname(__file__), "test_architecture.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "LAYERS":
            return [[name.split(".", 1)[1] for name in layer] for layer in ast.literal_eval(node.value)]
    raise AssertionError("tests/test_architecture.py defines no LAYERS")


def test_the_layers_the_page_states_are_the_enforced_ones():
    page = " ".join(open(PAGE).read().split())
    stated = page.split("Layers, lowest first: ", 1)[1].split(". ", 1)[0]
    layers = [re.findall(r"`(\w+)`", part) for part in stated.split("|")]
    assert layers == enforced_layers()
