"""A credit estimator of your own, trained for two steps on the tiny policy: a config dataclass, `@register`, and the
trainer; nothing else to add (docs/architecture.md, "Where to add").

    python examples/custom_estimator.py RUN_DIR

Registered here, `scaled_grpo` is an estimator like any other: `plan_run` resolves `method=scaled_grpo` and its
`credit.scale` option, the trainer runs it, and RUN_DIR/config.yaml records its options.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from credo.core.config import check
from credo.core.groups import broadcast, grpo_advantages
from credo.core.rollouts import Credit, Rollouts
from credo.credit import register
from credo.train.plan import plan_run
from credo.train.trainer import Trainer


@dataclass(frozen=True)
class ScaledGRPOConfig:
    """GRPO's advantages times a constant."""

    scale: float = 0.5
    """What each GRPO advantage is multiplied by, in (0, 1]."""

    def __post_init__(self) -> None:
        check(0 < self.scale <= 1, f"credit.scale must be in (0, 1], got {self.scale}")


@register("scaled_grpo", "GRPO's advantages times credit.scale (an example)", ScaledGRPOConfig)
def scaled_grpo(rollouts: Rollouts, probe: object, config: ScaledGRPOConfig) -> Credit:
    """advantages[B, T]: row i's GRPO advantage (r_i - group mean) / (group std + eps), times `scale`, on every
    trainable token of its completion (0 elsewhere)."""
    return Credit(advantages=broadcast(config.scale * grpo_advantages(rollouts.rewards, rollouts.group), rollouts))


SMALL = ["steps=2", "prompts_per_step=2", "group_size=4", "sampling.max_new_tokens=24", "eval_n=8", "final_eval_n=8",
         "eval_every=2", "checkpoint_every=2"]
"""Two short steps and small evaluations: the example finishes in under a minute on a CPU."""


def main(run_dir: str) -> dict:
    config, plan = plan_run(None, ["method=scaled_grpo", "credit.scale=0.25", *SMALL])
    summary = Trainer(config, run_dir, progress=False, plan=plan).train()
    print(json.dumps({"run": os.path.abspath(run_dir), "credit": config.credit, "step": summary["step"]}))
    return summary


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1].strip())
    main(sys.argv[1])
