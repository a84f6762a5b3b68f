"""One registry class: every extension point of credo (estimators, rollout strategies, reset localisers, tasks) is
found by name through a `Registry`, and an unknown name is one `ConfigError` listing what is registered.

`@REGISTRY.register(name, description, ConfigClass)` on an implementation adds an `Entry`; an extension point with
richer entries (the estimators' `EstimatorSpec`, an `Entry` with more fields) adds them with `Registry.add`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from credo.core.config import ConfigError, from_dict


@dataclass(frozen=True)
class Entry:
    """One registered implementation: `fn`, the frozen dataclass of its knobs (None: it has none) and what it does.
    privileged: it reads the task's reference solution or step labels (a bool, or a function of the options
    it runs with, e.g. the `credit` localiser is as privileged as the estimator it asks)."""

    name: str
    fn: Callable[..., Any]
    config_cls: type | None
    description: str
    privileged: bool | Callable[[Any], bool] = False
    settings: Callable[[Any], Any] | None = None
    """Where a training run's settings (a credo.train.config.TrainConfig) hold this entry's options, as a function
    of them (a strategy's: `lambda train: train.reset`); None: it takes none from there."""

    def reads_privileged(self, options: Any = None) -> bool:
        """Whether this entry, run with `options` (None: its defaults), reads privileged task data."""
        return bool(self.privileged(options)) if callable(self.privileged) else bool(self.privileged)

    def make_config(self, values: Any = None, prefix: str = "") -> Any:
        """The entry's config: `values` as is when it already is one, else built from a dict of fields
        (checked; errors name `prefix` + the field)."""
        if self.config_cls is None:
            if values:
                raise ConfigError(f"{prefix.rstrip('.') or self.name}: {self.name!r} takes no options, got {values!r}")
            return None
        if isinstance(values, self.config_cls):
            return values
        return from_dict(self.config_cls, dict(values or {}), prefix=prefix)


class Registry:
    """`kind` names what is registered ('strategy', 'localiser') in errors and in `credo methods`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, description: str, config_cls: type | None = None, *,
                 privileged: bool | Callable[[Any], bool] = False, settings: Callable[[Any], Any] | None = None
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register `fn` under `name` (`privileged`, `settings`: see Entry)."""

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(Entry(name, fn, config_cls, description, privileged, settings))
            return fn

        return wrap

    def add(self, entry: Entry) -> None:
        """Register `entry` under its name (a name registered twice is an error)."""
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} is registered twice")
        self._entries[entry.name] = entry

    def get(self, name: str, field: str = "") -> Any:
        """The entry registered as `name` (an Entry, or the richer entry `add` was given); an unknown name is one
        ConfigError listing what is registered, after `field` (the setting that named it) when given."""
        if name not in self._entries:
            where = f"{field}: " if field else ""
            raise ConfigError(f"{where}unknown {self.kind} {name!r}; registered: {', '.join(self._entries)}")
        return self._entries[name]

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def describe(self) -> list[tuple[str, str, str]]:
        """(name, kind, one-line description) of every entry, as `credo methods` prints them."""
        return [(e.name, self.kind, e.description) for e in self._entries.values()]
