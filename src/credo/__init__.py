"""credo: credit assignment for RL with verifiable rewards on reasoning language models."""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

_ALIASES = {"credo.checks": "credo.integrations.checks"}
"""Modules importable by a shorter name (`import credo.checks`, `from credo.checks import CreditCheckError`): the
same module object as the one they name, loaded only when imported (so `import credo` loads no torch)."""


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds each name of _ALIASES as the module it names: one module object under both names."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        return importlib.util.spec_from_loader(name, self) if name in _ALIASES else None

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return importlib.import_module(_ALIASES[spec.name])

    def exec_module(self, module) -> None:  # noqa: ANN001 - already executed under its own name
        pass


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.append(_AliasFinder())


def __getattr__(name: str):  # noqa: ANN202 - PEP 562: `credo.checks` without importing torch at `import credo`
    if f"credo.{name}" in _ALIASES:
        return importlib.import_module(f"credo.{name}")
    raise AttributeError(f"module 'credo' has no attribute {name!r}")
