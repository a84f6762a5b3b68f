"""The package's shape, checked from its source with `ast` (docs/architecture.md states the same rules):

- layers, lowest first: the library's base (`core`, alone: it reads backends and tasks through the protocols of
  core/protocols.py), the backends and the tasks (`policy`, `tasks`), `strategies`, `credit`, `integrations`, the
  trainer (`train`), the lab (`lab`), the commands (`cli`, alone on top); a module imports only its own layer or
  lower ones (so the library never imports the trainer or the lab, the trainer never the lab, the lab never a
  command);
- `policy/` (a backend) never imports `tasks` or `credit`; an estimator module never imports a sibling estimator
  (the package, its registry, the `credit` localiser and compose.py, the one wrapping mechanism, are shared);
- inside the lab, the audit never imports the show view (the view draws an audit's page; the command that ran the
  audit asks it to);
- importing the strategies loads no estimator (checked in a fresh interpreter);
- the import graph has no cycle (function-level imports included);
- at most 11 entries at the top of src/credo; no file in src/ is longer than 400 lines and no function longer than 60.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "src")
PACKAGE = os.path.join(SRC, "credo")
CREDIT_SHARED = {"credo.credit", "credo.credit.registry", "credo.credit.localiser", "credo.credit.compose"}
LAYERS = (("credo.core",), ("credo.policy", "credo.tasks"), ("credo.strategies",), ("credo.credit",),
          ("credo.integrations",), ("credo.train",), ("credo.lab",), ("credo.cli",))
"""The layers, lowest first: a module may import its own layer's modules and lower layers' only."""
MAX_TOP_LEVEL = 11
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_files() -> dict[str, str]:
    """Module name -> path of every .py file of the package."""
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, SRC)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join(parts)] = path
    return out


def imports_of(module: str, path: str, known: set[str]) -> set[str]:
    """The credo modules `module` imports anywhere in its file (`from a import b` counts as a.b when a.b
    is a module, else as a); TYPE_CHECKING-only imports included (they still state a dependency)."""
    tree = ast.parse(open(path).read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] == "credo" and n in known)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {m: imports_of(m, p, set(files)) for m, p in files.items()}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of `module`'s package (None: the top-level `credo` package itself)."""
    for index, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return index
    return None


def rule_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks a layering rule, as 'importer -> imported (rule)'."""
    out = []
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            mine, theirs = layer_of(module), layer_of(dep)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{module} -> {dep} (a higher layer)")
            if module.startswith("credo.credit.") and module not in CREDIT_SHARED:
                if dep.startswith("credo.credit.") and dep not in CREDIT_SHARED:
                    out.append(f"{module} -> {dep} (sibling estimator)")
            if module.startswith("credo.policy") and dep.startswith(("credo.tasks", "credo.credit")):
                out.append(f"{module} -> {dep} (a backend knows no task or estimator)")
            if module.startswith("credo.lab.audit") and dep.startswith("credo.lab.show"):
                out.append(f"{module} -> {dep} (the audit knows no view)")
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, first == last), or None. A package's __init__ importing its own
    submodules (re-exports) is no cycle with them: the submodules' imports of the package's siblings
    name the submodules, never the package."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_rules_see_a_break_and_a_cycle() -> None:
    """The checks themselves: planted breaks and a planted cycle are found."""
    graph = {"credo.credit.mc": {"credo.credit.rredcot", "credo.train.trainer"},
             "credo.policy.hf": {"credo.tasks.chat"},
             "credo.strategies.resets": {"credo.credit.registry"}, "credo.core.probe": {"credo.lab.audit.run"},
             "credo.credit.rredcot": {"credo.core.values", "credo.strategies.localisers"},
             "credo.train.trainer": {"credo.lab.compare.run"}, "credo.lab.show.view": {"credo.cli.options"},
             "credo.core.values": {"credo.policy.base"}, "credo.lab.audit.run": {"credo.lab.show.view"},
             "credo.a": {"credo.b"}, "credo.b": {"credo.a"}}
    assert rule_breaks(graph) == ["credo.core.probe -> credo.lab.audit.run (a higher layer)",
                                  "credo.core.values -> credo.policy.base (a higher layer)",
                                  "credo.credit.mc -> credo.credit.rredcot (sibling estimator)",
                                  "credo.credit.mc -> credo.train.trainer (a higher layer)",
                                  "credo.lab.audit.run -> credo.lab.show.view (the audit knows no view)",
                                  "credo.lab.show.view -> credo.cli.options (a higher layer)",
                                  "credo.policy.hf -> credo.tasks.chat (a backend knows no task or estimator)",
                                  "credo.strategies.resets -> credo.credit.registry (a higher layer)",
                                  "credo.train.trainer -> credo.lab.compare.run (a higher layer)"]
    assert find_cycle(graph) == ["credo.a", "credo.b", "credo.a"]
    assert find_cycle({"credo.a": {"credo.b"}, "credo.b": set()}) is None


def test_every_module_is_in_a_layer() -> None:
    """A new top-level package must be placed in LAYERS (or the rules would not see it)."""
    assert sorted(m for m in import_graph() if m != "credo" and layer_of(m) is None) == []


def test_importing_the_strategies_loads_no_estimator() -> None:
    code = "import sys, credo.strategies; print(sorted(m for m in sys.modules if m.startswith('credo.credit')))"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]"


def test_the_top_level_shows_the_architecture() -> None:
    entries = sorted(e for e in os.listdir(PACKAGE) if not e.startswith((".", "__pycache__")))
    assert len(entries) <= MAX_TOP_LEVEL, entries


def test_imports_are_resolved_to_modules() -> None:
    graph = import_graph()
    assert "credo.credit.registry" in graph["credo.credit.rredcot"]
    assert "credo.core.protocols" in graph["credo.core.probe"]


def test_import_rules_hold() -> None:
    assert rule_breaks(import_graph()) == []


def test_no_import_cycle() -> None:
    assert find_cycle(import_graph()) is None


def test_no_file_over_400_lines() -> None:
    long = {os.path.relpath(p, SRC): n for p in module_files().values()
            if (n := sum(1 for _ in open(p))) > MAX_FILE_LINES}
    assert long == {}


def long_functions() -> dict[str, int]:
    out = {}
    for path in module_files().values():
        tree = ast.parse(open(path).read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out[f"{os.path.relpath(path, SRC)}:{node.lineno} {node.name}"] = length
    return out


def test_no_function_over_60_lines() -> None:
    assert long_functions() == {}
