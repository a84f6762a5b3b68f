"""`credo methods`: every registered estimator, recipe, rollout strategy and reset localiser, one per line."""

from __future__ import annotations

import argparse


def cmd_methods(args: argparse.Namespace) -> int:
    # the registries load every estimator (torch, ~2 s): imported when the command runs, so that `credo --help`
    # stays fast
    from credo.strategies import LOCALISERS, STRATEGIES
    from credo.train import methods
    marks = {name: methods.privileged(name) for name, _, _ in methods.describe()}
    marks.update({name: LOCALISERS.get(name).reads_privileged() for name in LOCALISERS.names()})
    rows = methods.describe() + STRATEGIES.describe() + LOCALISERS.describe()
    width = max(len(r[0]) for r in rows)
    print(f"{'name':<{width}}  {'kind':<9}  {'privileged':<10}  description")
    for name, kind, description in rows:
        mark = "-" if kind == "strategy" else "yes" if marks[name] else "no"
        print(f"{name:<{width}}  {kind:<9}  {mark:<10}  {description}")
    print("privileged: reads the task's reference solution, step labels or gold answer beyond the reward "
          "(with its default options; see docs/methods.md)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`credo methods`."""
    p = sub.add_parser("methods", help="list the registered estimators, recipes, rollout strategies (train.strategy) "
                       "and reset localisers (train.reset.localiser), one per line: name, kind, description")
    p.set_defaults(fn=cmd_methods)
