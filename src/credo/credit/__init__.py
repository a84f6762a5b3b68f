"""Credit estimators: outcome baselines and the segment/token-level methods, one registry."""

from credo.credit.registry import EstimatorSpec, get, names, parse_spec, register  # noqa: F401
from credo.credit import attribution, ibpo, mc, outcome, rredcot, sc_grpo, shuffled  # noqa: F401  (registration side effects)
from credo.credit import entropy, otb, prefix_shaping, tree  # noqa: F401  (registration side effects)
from credo.credit import localiser  # noqa: F401  (registers the `credit` reset localiser)
