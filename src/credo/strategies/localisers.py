"""Reset localisers: which step of a failed trace is its first error? (credo.credit.localisers, re-exported.)

The localiser registry lives in credo.credit.localisers, a helper of the estimators, because the
`prefix_shaping` estimator uses it too; the resets strategy, the audit and older imports find it here.
"""

from credo.credit.localisers import (  # noqa: F401  (re-exported)
    LOCALISERS, LocaliserOptions, Parents, _boxed_step, credit_privileged, first_value_drop, localisation_replies,
    localise, localise_by_credit, localise_by_oracle, localise_by_prompt, localise_by_self, localise_by_value,
    localise_by_value_drop, localise_randomly, parse_step, parse_step_index)
