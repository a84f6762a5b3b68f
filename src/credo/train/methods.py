"""Trainable methods: an estimator plus the loss/strategy settings its paper prescribes.

A plain estimator name (`grpo`, `rloo`, ...) is a method with no extra settings. Recipes bundle
an estimator with defaults that the user's config may still override:
  dr_grpo  Dr. GRPO advantages + loss normalised by a constant length
  dapo     GRPO advantages + clip-higher (0.2/0.28) + token-mean + dynamic sampling + overlong penalty
  gspo     GRPO advantages + sequence-level ratio (pi/pi_old)^(1/|o|), clipped per sequence
dapo and gspo compose with any estimator's credit: 'dapo:of=rredcot:options.include_reference=false' is RREDCoT's
advantages under DAPO's settings (the `options.` prefix hands an option to the estimator, as for `shuffled`).
  rrpo     reset rollouts at random steps of failed traces; -A log pi on suffixes (no ratio, no clip)
  srpo     reset rollouts at the self-localised first error; same loss (`loss.kind=clip`: srpo_clip)
A reset recipe takes its localiser in the method spec: 'srpo:localiser=prompt' (any other option is the
estimator's, e.g. 'rredcot:include_reference=false').
No recipe sets the optimiser schedule (epochs x minibatches): every method gets TrainConfig's one
schedule, as the public SRPO code gives its GRPO baseline and SRPO the same. A method whose paper
prescribes another schedule says so here, in its recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from credo import credit
from credo.core.config import ConfigError, merge
from credo.credit.registry import EstimatorSpec
from credo.strategies import LOCALISERS


@dataclass(frozen=True)
class Recipe:
    estimator: str
    description: str
    defaults: dict[str, Any] = field(default_factory=dict)
    composes: bool = False
    """Whether the recipe's settings (loss, strategy) apply to any estimator's credit: `dapo:of=<estimator>`
    trains that estimator's advantages with DAPO's clip-higher, token-mean loss, dynamic sampling and overlong
    penalty (options.<key>=... are the estimator's options, as for a `shuffled` control)."""


RECIPES: dict[str, Recipe] = {
    "dr_grpo": Recipe("dr_grpo", "Dr. GRPO: r - group mean, loss summed per token / (G * max length)",
                      {"loss": {"aggregation": "seq-mean-token-sum-norm"}}),
    "dapo": Recipe("grpo", "DAPO: clip-higher 0.2/0.28, token-mean loss, dynamic sampling, overlong penalty",
                   {"loss": {"eps_low": 0.2, "eps_high": 0.28, "aggregation": "token-mean"},
                    "strategy": "dynamic", "overlong_buffer": 16, "overlong_fit_task": True}, composes=True),
    "rrpo": Recipe("grpo", "RRPO: reset a failed trace at a random step, resample suffixes; groups z-scored apart",
                   {"strategy": "resets", "reset": {"localiser": "random"}, "credit": {"std": "population"},
                    "loss": {"kind": "pg"}}),
    "srpo": Recipe("grpo", "SRPO: reset where the model itself localises the first error (asked, as the paper; "
                   "its own value where the policy cannot read a localisation request, e.g. the "
                   "earlier tiny arith starts)",
                   {"strategy": "resets", "reset": {"localiser": "self"}, "credit": {"std": "population"},
                    "loss": {"kind": "pg"}}),
    "gspo": Recipe("grpo", "GSPO: sequence-level importance ratio (pi/pi_old)^(1/|o|), clipped per sequence",
                   {"loss": {"ratio": "sequence", "eps_low": 3e-4, "eps_high": 4e-4}}, composes=True),
}


def resolve(method: str) -> Recipe:
    """The recipe for `method` (a plain estimator is a recipe with no defaults)."""
    if method in RECIPES:
        return RECIPES[method]
    if ":" in method:  # 'name:key=value:...': an estimator with options, e.g. 'shuffled:of=rredcot'
        name, options = credit.parse_spec(method)
        base = resolve(name)
        if "of" in options and name in RECIPES:
            return composed(method, name, base, options)
        settings: dict[str, Any] = {"credit": options}
        if "localiser" in options and base.defaults.get("strategy") == "resets":  # 'srpo:localiser=prompt'
            settings = {"credit": {k: v for k, v in options.items() if k != "localiser"},
                        "reset": {"localiser": options["localiser"]}}
        return Recipe(base.estimator, base.description, merge(base.defaults, settings))
    if method not in credit.names():
        raise ConfigError(f"unknown method {method!r}; available: {', '.join(available())}")
    return Recipe(method, credit.get(method).description)


def composed(method: str, name: str, base: Recipe, options: dict[str, str]) -> Recipe:
    """`name:of=<estimator>:options.<key>=<value>...`: the recipe `name`'s settings on another estimator's
    credit. Only a recipe that `composes` takes of=; the estimator must be a registered estimator, not a recipe
    (two recipes' settings would overlap)."""
    if not base.composes:
        raise ValueError(f"method {method!r}: {name} does not take of= (only "
                         f"{', '.join(r for r, recipe in RECIPES.items() if recipe.composes)} apply to another "
                         "estimator's credit)")
    inner = options["of"]
    if inner in RECIPES or inner not in credit.names():
        raise ValueError(f"method {method!r}: of={inner!r} must name an estimator "
                         f"({', '.join(credit.names())})")
    stray = [k for k in options if k != "of" and not k.startswith("options.")]
    if stray:
        raise ValueError(f"method {method!r}: option {stray[0]!r}: with of=, the estimator's options are written "
                         f"options.<key>=<value> (e.g. {name}:of=rredcot:options.include_reference=false)")
    inner_options = {k[len("options."):]: v for k, v in options.items() if k.startswith("options.")}
    return Recipe(inner, f"{base.description}, on {inner}'s credit",
                  merge(base.defaults, {"credit": inner_options}))


def credit_spec(method: str) -> str:
    """The estimator spec whose credit `method` trains with: the spec itself for an estimator
    ('rredcot:include_reference=false'), the composed estimator for a recipe with of=
    ('dapo:of=rredcot:options.include_reference=false' -> 'rredcot:include_reference=false'), the recipe's
    estimator otherwise ('dapo' -> 'grpo')."""
    name, options = credit.parse_spec(method)
    if name not in RECIPES:
        return method
    recipe = resolve(method)
    if "of" not in options:
        return recipe.estimator
    return ":".join([recipe.estimator, *(f"{k}={v}" for k, v in recipe.defaults.get("credit", {}).items())])


def recipe_of(method: str, field: str = "train.method") -> Recipe:
    """`method`'s recipe (resolve); an unknown name or a malformed spec is a ConfigError naming `field`."""
    try:
        return resolve(method)
    except ValueError as err:  # ConfigError included: the message gets the setting that named the method
        raise ConfigError(f"{field}: {err.args[0]}") from None


def estimator_of(method: str, field: str = "train.method") -> EstimatorSpec:
    """The registered estimator `method` (an estimator, 'name:key=value:...' or a recipe) resolves to; an unknown
    name is a ConfigError naming `field`."""
    return credit.get(recipe_of(method, field).estimator)


def available() -> list[str]:
    names = list(credit.names())
    return names + [r for r in RECIPES if r not in names]


def privileged(method: str) -> bool:
    """Whether `method` (an estimator, a spec with options or a recipe) reads privileged task data (the
    reference solution, step labels or the gold answer beyond the reward): its estimator with the recipe's
    credit options, or its reset localiser (credo.credit.registry.EstimatorSpec.privileged)."""
    recipe = resolve(method)
    spec = credit.get(recipe.estimator)
    if spec.reads_privileged(spec.make_config(recipe.defaults.get("credit", {}))):
        return True
    resets = recipe.defaults.get("strategy") == "resets"
    localiser = recipe.defaults.get("reset", {}).get("localiser") if resets else None
    return localiser is not None and LOCALISERS.get(localiser).reads_privileged()


def describe() -> list[tuple[str, str, str]]:
    """(name, kind, one-line description) for every trainable method."""
    rows = []
    for name in available():
        recipe = resolve(name)
        kind = "recipe" if name in RECIPES else "estimator"
        rows.append((name, kind, recipe.description))
    return rows
