"""A named registry of interchangeable implementations, each with its config class and a one-line description.

Rollout strategies and reset localisers are found by name through one of these, as estimators are
through `credo.credit`'s: `@STRATEGIES.register("plain", "...")` on the implementation, `STRATEGIES.get(name)`
to find it, `describe()` for `credo methods`. The class lives in credo.credit.registry, beside the estimator
registry, so that the localiser registry (credo.credit.localisers), which estimators use too, can be one.
"""

from credo.credit.registry import Entry, Registry  # noqa: F401  (re-exported)
