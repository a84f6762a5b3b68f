"""The named random streams of a training run: every random draw comes from exactly one of them."""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

import torch

from credo.core.state_io import python_rng_from, python_rng_state

SEED_OFFSETS = {"sample": 0, "problem": 1, "minibatch": 2, "probe": 3, "reset": 4}
"""Stream name -> offset of its seed from the run's seed. Part of what a seed means: changing one changes every run."""


@dataclass
class RandomStreams:
    """One stream per kind of draw, each seeded `seed + SEED_OFFSETS[name]`, so adding draws to one kind
    leaves the others unchanged. Checkpoints store a torch stream as the tensor `<name>_generator` and a
    python one as the JSON state `<name>_rng`."""

    sample: torch.Generator    # the completions the strategy samples
    problem: torch.Generator   # which training problems each step draws
    minibatch: random.Random   # the order of rows into minibatches, every epoch
    probe: torch.Generator     # what estimators and localisers sample through the Probe
    reset: random.Random       # the random localiser's picks

    @classmethod
    def seeded(cls, seed: int) -> "RandomStreams":
        def torch_stream(name: str) -> torch.Generator:
            return torch.Generator().manual_seed(seed + SEED_OFFSETS[name])

        def python_stream(name: str) -> random.Random:
            return random.Random(seed + SEED_OFFSETS[name])

        return cls(sample=torch_stream("sample"), problem=torch_stream("problem"), minibatch=python_stream("minibatch"),
                   probe=torch_stream("probe"), reset=python_stream("reset"))

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors, JSON-able states) of every stream, under their checkpoint names."""
        tensors, states = {}, {}
        for name, stream in self._named():
            if isinstance(stream, torch.Generator):
                tensors[f"{name}_generator"] = stream.get_state()
            else:
                states[f"{name}_rng"] = python_rng_state(stream.getstate())
        return tensors, states

    def load(self, tensors: dict[str, torch.Tensor], states: dict[str, Any]) -> None:
        """Restore every stream from what `state()` returned (a missing one is a KeyError naming it)."""
        for name, stream in self._named():
            if isinstance(stream, torch.Generator):
                stream.set_state(tensors[f"{name}_generator"])
            else:
                stream.setstate(python_rng_from(states[f"{name}_rng"]))

    def _named(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]
