"""credo: credit assignment for RL with verifiable rewards on reasoning language models."""

__version__ = "0.1.0"


def __getattr__(name: str):  # noqa: ANN202 - PEP 562: `credo.checks` without importing torch at `import credo`
    if name == "checks":
        import importlib
        return importlib.import_module("credo.integrations.checks")
    raise AttributeError(f"module 'credo' has no attribute {name!r}")
