"""credo's reward-only estimators in verl's registry on `import verl`: the `verl.plugins` entry point.

verl (0.9.1 and later) loads every entry point of the group `verl.plugins` when it is imported (unless
VERL_USE_EXTERNAL_PLUGINS=none, or a list of plugin names that leaves out `credo`), in the driver and in every
Ray worker. credo's pyproject.toml declares

    [project.entry-points."verl.plugins"]
    credo = "credo.integrations.verl_plugin"

so with credo installed, `algorithm.adv_estimator=credo_grpo` (credo_dr_grpo, credo_rloo) works with verl's own
`python -m verl.trainer.main_ppo`, no custom main. Loading the entry point imports this module, and importing it
registers the estimators (register_with_verl(): credo's credit checks on; calling it again with other settings
replaces them). Estimators that need the model (`credo:<name>`) still need credo's worker and trainer
(`python -m credo.integrations.verl_ppo`): verl hands a registered estimator rewards, masks and group ids only.

verl logs a plugin that raises at DEBUG level only, so a registration that fails would be silent; here it is one
line on stderr (and an ERROR log record on the `credo` logger) naming the estimator and the cause, before the
error is raised (verl then goes on without credo's estimators, and `adv_estimator=credo_grpo` is unknown to it).
"""

from __future__ import annotations

import logging
import sys

from credo.integrations.verl import REWARD_ONLY, register_with_verl


class PluginRegistrationError(RuntimeError):
    """credo's verl plugin could not register an estimator; the message names it."""


def _fail(estimator: str, err: BaseException) -> PluginRegistrationError:
    cause = " ".join(f"{type(err).__name__}: {err}".split())  # one line, whatever the cause's message holds
    line = (f"credo: verl plugin could not register estimator {estimator} ({cause}); "
            f"algorithm.adv_estimator={estimator} will be unknown to verl")
    print(line, file=sys.stderr, flush=True)
    logging.getLogger("credo").error(line)
    return PluginRegistrationError(line)


def register_all() -> list[str]:
    """register_with_verl() one estimator at a time, so each failure is its own line naming its estimator (the
    others are still registered); raises the first failure after trying them all. -> the names registered."""
    done, failures = [], []
    for name in REWARD_ONLY:
        try:
            done += register_with_verl(names=(name,))
        except Exception as err:  # anything: verl would swallow it at DEBUG level
            failures.append((_fail(f"credo_{name}", err), err))
    if failures:
        raise failures[0][0] from failures[0][1]
    return done


REGISTERED = register_all()
"""The estimator names registered in verl's registry when verl loaded this plugin."""
