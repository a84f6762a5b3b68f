"""The house's shape in numbers, recomputed from a source tree (default: this checkout's src/):

    python scripts/house_measures.py [SRC]

- package pairs: of the 10 packages (credo's top-level module and its 9 sub-packages), how many pairs have an
  import between them, and how many import each other both ways;
- upward arrows: module imports from a lower layer to a higher one, the layers being the ones
  docs/architecture.md states (core, then policy and tasks, strategies, credit, integrations, train, lab, cli;
  inside the lab, show above audit), function-level imports included;
- function-level imports (an import statement inside a function body), credo-internal and third-party;
- files over 300 lines, functions of 55 lines or more;
- re-export shims: imports marked `noqa: F401` outside a package's __init__.py.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import sys

PACKAGES = ("core", "policy", "tasks", "strategies", "credit", "integrations", "train", "lab", "cli")
RANK = {"core": 0, "policy": 1, "tasks": 1, "strategies": 2, "credit": 3, "integrations": 4, "train": 5,
        "lab": 6, "cli": 7}
"""The stated layers, lowest first (policy and tasks share one: neither imports the other)."""
LAB_RANK = {"audit": 0, "compare": 1, "show": 1}
"""Inside the lab: the audit is read by the comparison and the show view, and reads neither."""


def modules(src: str) -> dict[str, str]:
    """Module name -> path of every .py file under src/credo."""
    out = {}
    for root, _, files in os.walk(os.path.join(src, "credo")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, src)[:-3].split(os.sep)
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(node: ast.AST, module: str, path: str, known: set[str]) -> list[str]:
    """The modules an import statement names (`from a import b` is a.b when a.b is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def function_imports(tree: ast.AST) -> list[ast.AST]:
    """Import statements inside function bodies."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in fn.body:
                found += [n for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return list({id(n): n for n in found}.values())


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "credo"


def is_up(importer: str, dep: str) -> bool:
    a, b = package_of(importer), package_of(dep)
    if a in RANK and b in RANK and RANK[b] > RANK[a]:
        return True
    if a == b == "lab":
        sub_a, sub_b = importer.split(".")[2:3], dep.split(".")[2:3]
        if sub_a and sub_b and sub_a[0] in LAB_RANK and sub_b[0] in LAB_RANK:
            return LAB_RANK[sub_b[0]] > LAB_RANK[sub_a[0]]
    return False


def measure(src: str) -> dict:
    files = modules(src)
    known = set(files)
    edges, fn_imports, fn_internal, long_files, long_functions, shims = set(), 0, 0, [], [], []
    for module, path in files.items():
        text = open(path).read()
        tree = ast.parse(text, path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in imported(node, module, path, known):
                    if name in known and name != module:
                        edges.add((module, name))
        inner = function_imports(tree)
        fn_imports += len(inner)
        fn_internal += sum(1 for n in inner if any(x.startswith("credo") for x in imported(n, module, path, known)))
        lines = text.count("\n")
        if lines > 300:
            long_files.append(f"{os.path.relpath(path, src)} {lines}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 >= 55:
                long_functions.append(f"{os.path.relpath(path, src)}:{node.lineno} {node.name} "
                                      f"{node.end_lineno - node.lineno + 1}")
        if not path.endswith("__init__.py"):
            shims += [f"{os.path.relpath(path, src)}:{i}" for i, line in enumerate(text.splitlines(), 1)
                      if "noqa: F401" in line]
    pairs = {(package_of(a), package_of(b)) for a, b in edges if package_of(a) != package_of(b)}
    linked = {frozenset(p) for p in pairs}
    both = sorted("<->".join(sorted(p)) for p in linked if len(p) == 2 and tuple(p)[::-1] in pairs
                  and tuple(p) in pairs)
    up = sorted(f"{a} -> {b}" for a, b in edges if is_up(a, b))
    n = len(("credo",) + PACKAGES)
    return {"package_pairs_with_an_import": f"{len(linked)} of {len(list(itertools.combinations(range(n), 2)))}",
            "pairs_importing_both_ways": both, "module_imports": len(edges),
            "upward_arrows": len(up), "upward": up,
            "function_level_imports": fn_imports, "function_level_imports_internal": fn_internal,
            "files_over_300_lines": len(long_files), "long_files": sorted(long_files),
            "functions_55_lines_or_more": len(long_functions), "long_functions": sorted(long_functions),
            "re_export_shims": len(shims), "shims": shims}


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    print(json.dumps(measure(root), indent=1))
