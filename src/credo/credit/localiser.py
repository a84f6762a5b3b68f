"""The `credit` reset localiser: the most negative segment of an estimator's credit. It asks an estimator, so it
lives with them and registers itself in the strategies' localiser registry (strategies never import estimators)."""

from __future__ import annotations

import torch

from credo.core.segment import segment_means
from credo.credit.registry import get, parse_spec
from credo.strategies.localisers import LOCALISERS, LocaliserOptions, Parents


def credit_privileged(options: LocaliserOptions | None) -> bool:
    """The credit localiser reads what its estimator reads (credo.credit.registry.EstimatorSpec.privileged)."""
    name, values = parse_spec((options or LocaliserOptions()).credit_method)
    spec = get(name)
    return spec.reads_privileged(spec.make_config(values))


@LOCALISERS.register("credit", "the most negative segment of an estimator's credit (credit_method, default rredcot)",
                     privileged=credit_privileged)
def localise_by_credit(parents: Parents, options: LocaliserOptions) -> list[int]:
    """For each parent, the first of its segments with the lowest mean of advantage x weight (as the audit
    scores credit) under the estimator `options.credit_method`, run once on the parents' whole batch."""
    name, values = parse_spec(options.credit_method)
    spec = get(name)
    batch = parents.rollouts.with_fields(segment_ids=parents.segment_ids)
    result = spec(batch, parents.probe, spec.make_config(values))
    effective = result.advantages if result.weights is None else result.advantages * result.weights
    means = segment_means(effective[parents.rows], parents.segment_ids[parents.rows])
    return [int(torch.argmin(m)) if m.numel() else 0 for m in means]


# the estimator's batch statistics are collectives (Probe.gather): a shard with no failed trace runs it too
localise_by_credit.every_shard = True
