"""Credit built on another estimator's credit: the one way an estimator wraps another (`of=<method>`).

A wrapping estimator's config has `of` (the wrapped estimator's name) and `options` (its options). A method
spec's keys are paths in the wrapper's config: a key the wrapper knows is its own (`tempo:of=rredcot:lam=0.5`
sets TEMPO's lam), `options.<key>` is the wrapped method's (`options.lam=0.5`: RREDCoT's), and a key the
wrapper does not know lands in `options` as a shortcut (`entropy_mask:of=rredcot:include_reference=false`).
Wrappers nest the same way: `shuffled:of=tempo:options.of=rredcot` is the control of `tempo:of=rredcot`.
Used by `shuffled` (the controls), `entropy_mask` (the mask on any credit) and `tempo` (the trie's branch
credit added to any credit). The wrapped estimator's cost is counted inside the wrapper's (the registry meters
the whole call), and the wrapper is privileged when the method it wraps is.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from credo.core.config import check, to_dict
from credo.core.rollouts import Credit, Rollouts
from credo.credit.registry import get, wrapped

class Wrapping:
    """Base of a wrapping estimator's config (fields `of` and `options`): the options a method spec gives it are
    routed by `route_options`, which the registry calls when it builds the config."""

    @classmethod
    def route_options(cls, values: dict) -> dict:
        """`values` (a copy of the spec's options) with every key this config does not know, and every
        `options.<key>` (a key it knows too: `shuffled:of=tempo:options.of=rredcot` is the method tempo wraps),
        moved into `options`, for the method it wraps."""
        known, nested = {f.name for f in fields(cls)}, "options."
        extra = {k.removeprefix(nested): values.pop(k) for k in list(values) if k not in known or k.startswith(nested)}
        values["options"] = {**dict(values.get("options") or {}), **extra}
        return values


MAX_WRAPPING = 8
"""Methods a wrapper may wrap inside one another (`shuffled:of=tempo:options.of=rredcot` wraps 2); each level
checks and builds the next, so a nesting hundreds deep would exhaust Python's recursion instead."""


def wrapping_depth(options: dict) -> int:
    """How many methods a wrapper wraps inside one another, given `options` (its wrapped method's): 1, plus one
    for each `of` within them, dotted keys (`options.of`) and nested `options` mappings alike, counted without
    recursion."""
    deepest, todo = 1, [(options, 1)]
    while todo:
        level, depth = todo.pop()
        for key, value in level.items():
            parts = str(key).split(".")
            below = depth + parts.count("options") + (parts[-1] == "of")
            deepest = max(deepest, below)
            if parts[-1] == "options" and isinstance(value, dict):
                todo.append((value, below))
    return deepest


def check_wrapped(owner: str, of: str, options: dict) -> None:
    """Raise a ValueError naming `credit.of` (or the stray option) unless `of` is a registered estimator other
    than `owner` whose options `options` are valid and nest at most MAX_WRAPPING methods deep; of='' (no
    wrapped method) takes no options."""
    if not of:
        check(not options, f"credit.{next(iter(options), '')} is not an option of {owner} "
              "(options of a wrapped method need of=<method>)")
        return
    check(of != owner, f"credit.of: {owner} cannot wrap itself")
    depth = wrapping_depth(options)
    check(depth <= MAX_WRAPPING, f"credit.options: {owner} wraps methods {depth} deep, over the limit of "
          f"{MAX_WRAPPING} (a wrapped method's own options.of=... wraps one more)")
    inner = get(of, "credit.of")
    inner.make_config(options, prefix="options.")  # checked now; from_dict puts the path before it


def recorded_options(config: Any) -> dict[str, Any]:
    """An estimator's config as a run records it: every option, and a wrapper's `options` completed the same way
    (the wrapped estimator's every option, nested wrappers' too), so that a record lacking an option was written
    before that option existed or changed its default (credo.train.config.as_recorded)."""
    tree = to_dict(config)
    if isinstance(config, Wrapping) and config.of:  # its `options` may be left out of to_dict while empty
        tree["options"] = recorded_options(get(config.of).make_config(dict(config.options)))
    return tree


def wrapped_credit(of: str, options: dict, rollouts: Rollouts, probe: Any) -> tuple[Credit, Any]:
    """(the wrapped estimator's Credit on `rollouts`, its config)."""
    inner = get(of)
    config = inner.make_config(options)
    return inner(rollouts, probe, config), config


def wrapped_privileged(config: Any) -> bool:
    """Whether the method a wrapper's `config` wraps reads privileged task data (False when it wraps none)."""
    inner = wrapped(config)
    return inner is not None and inner[0].reads_privileged(inner[1])
