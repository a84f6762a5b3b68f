"""Rollout strategies decide *which* completions are sampled; estimators decide what credit they get.

One registry, found by name like the estimators (`credo methods` lists both):
  plain    G completions for each of the step's prompts            (sampling.py)
  dynamic  DAPO dynamic sampling                                    (sampling.py)
  resets   RRPO/SRPO reset rollouts, with a registered localiser    (resets.py, localisers.py)
`make(name, options).collect(ctx, n_prompts)` runs one; data parallelism wraps any of them
(credo.train.distributed.Sharded). To add a strategy, copy `collect_plain` in sampling.py: a function
`(ctx: SamplingContext, n_prompts, config) -> Collected` under `@register(name, description, ConfigClass)`.
"""

from credo.strategies.base import STRATEGIES, Collected, SamplingContext, Strategy, make, register  # noqa: F401
from credo.strategies.localisers import LOCALISERS  # noqa: F401
from credo.strategies.sampling import mixed_groups, sample_groups  # noqa: F401
from credo.strategies import resets  # noqa: F401  (registers the resets strategy)
