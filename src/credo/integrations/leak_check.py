"""Masked-perturbation invariance: a masked input must not reach a valid token's advantage (credo.checks).

The commonest silent advantage bug is a masked position leaking into the advantages of valid tokens: padding
summed into a sequence advantage, placeholder rows counted in a group's baseline, a masked value bootstrapping
valid tokens. credo's other checks (credo.integrations.checks: finite, zero outside the mask, group sums) look
at the advantages only, so they cannot see such a leak. This check changes what should not matter and looks
for a change where it must not be:

  1. run the estimator on its inputs;
  2. refill every masked position of every input (per-token fields outside the valid tokens, every field of a
     placeholder row) with large random values (|x| up to LEAK_SCALE; integer fields: random ids in range);
  3. run it again (model-reading estimators: from the same generator state, so their own sampling repeats);
  4. require the advantages of the valid tokens of valid rows to be identical (float equality: every credo
     estimator reaches it; see the tolerance argument for backends whose kernels are not batch-invariant).
A valid row's advantage is its value minus its baseline, so an unchanged advantage is an unchanged baseline
for the other members of a placeholder row's group.

Opt-in in both adapters (`CreditGRPOTrainer(leak_check=True)`; verl: `apply_credit(leak_check=True)`,
`+credo.leak_check=true`): it runs the estimator twice, so a model-reading estimator's credit costs twice its
model work. `where` is a credo.integrations.checks.Where: a failure is its CreditCheckError naming the check
(`masked_invariance`), the row, the first token that moved and the step. The perturbation draws from its own
generator (seeded by `seed`): the trainer's random streams are not consumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from credo.core.rollouts import Rollouts

LEAK_SCALE = 1e4
"""Refilled float inputs are uniform in [-LEAK_SCALE, LEAK_SCALE]: far outside any reward, log-prob or value,
so a leak moves the advantage by far more than rounding, and finite, so a leak is a wrong number, not a NaN
some other check would catch first."""
SEGMENT_ID_RANGE = 1 << 16
"""Refilled segment ids are random in [0, SEGMENT_ID_RANGE) (padding's -1 is the documented value: a reader that
relies on it instead of the mask is the leak this check is for)."""


@dataclass(frozen=True)
class MaskedInputs:
    """An estimator's inputs with what is masked in them. tensors: name -> [B] per-row or [B, T] per-token
    input. valid[B, T]: the valid tokens (the advantages compared). row_valid[B] (None: every row is a real
    sample): False on placeholder rows, every input of which is masked. integer_high: name -> the exclusive
    upper bound of an integer field's random refill (token ids: the vocabulary size)."""

    tensors: Mapping[str, torch.Tensor]
    valid: torch.Tensor
    row_valid: torch.Tensor | None = None
    integer_high: Mapping[str, int] | None = None


def refill(values: torch.Tensor, masked: torch.Tensor, generator: torch.Generator,
           high: int | None = None) -> torch.Tensor:
    """values with every position where masked (same shape, or [B] per row) replaced by a random value: float
    uniform in +-LEAK_SCALE, integer uniform in [0, high), bool uniform. The generator is the caller's."""
    if not bool(masked.any()):
        return values
    shape = tuple(values.shape)
    if values.dtype == torch.bool:
        noise = torch.rand(shape, generator=generator) < 0.5
    elif values.dtype.is_floating_point:
        noise = ((torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * LEAK_SCALE).to(values.dtype)
    else:
        noise = torch.randint(0, int(high if high is not None else SEGMENT_ID_RANGE), shape, generator=generator,
                              dtype=values.dtype)
    return torch.where(masked.to(values.device), noise.to(values.device), values)


def perturbed(inputs: MaskedInputs, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Every input of `inputs` with its masked positions refilled (see MaskedInputs)."""
    valid = inputs.valid.bool().cpu()
    every = torch.ones(len(valid), dtype=torch.bool)
    row_valid = inputs.row_valid.bool().cpu() if inputs.row_valid is not None else every
    highs = dict(inputs.integer_high or {})
    out = {}
    for name, value in inputs.tensors.items():
        if value.dim() == 1:
            masked = ~row_valid
        elif value.dim() == 2 and tuple(value.shape) == tuple(valid.shape):
            masked = ~valid | ~row_valid[:, None]
        else:
            raise ValueError(f"masked-invariance input {name!r} has shape {tuple(value.shape)}; expected [B] = "
                             f"{(len(valid),)} or [B, T] = {tuple(valid.shape)}")
        out[name] = refill(value, masked, generator, highs.get(name))
    return out


def compare(before: torch.Tensor, after: torch.Tensor, valid: torch.Tensor, where: Any, what: str,
            tolerance: float = 0.0) -> None:
    """Raise masked_invariance naming the first valid token (valid[B, T]) whose advantage moved by more
    than tolerance x max(1, |before|) between before[B, T] and after[B, T]."""
    before, after, valid = before.detach().cpu().double(), after.detach().cpu().double(), valid.bool().cpu()
    moved = (before - after).abs() > tolerance * before.abs().clamp(min=1.0)
    moved = (moved | (torch.isfinite(before) != torch.isfinite(after))) & valid
    if bool(moved.any()):
        row, token = (int(i) for i in moved.nonzero()[0])
        raise where.fail("masked_invariance", row, f"refilling {what} with random values moved the advantage of "
                         f"valid token {token} from {float(before[row, token]):.6g} to {float(after[row, token]):.6g} "
                         f"({int(moved.sum())} valid token(s) moved): a masked input leaks into valid credit")


def check_masked_invariance(estimate: Callable[[Mapping[str, torch.Tensor]], torch.Tensor], inputs: MaskedInputs,
                            where: Any, *, seed: int = 0, before: torch.Tensor | None = None,
                            tolerance: float = 0.0) -> None:
    """estimate(tensors) -> advantages[B, T] must give the valid tokens of valid rows the same advantages on
    `inputs` as on `inputs` with every masked position refilled (module docstring). before: estimate(inputs
    .tensors) when the caller has it already (the adapters: the advantages they are about to hand over)."""
    if before is None:
        before = estimate(inputs.tensors)
    after = estimate(perturbed(inputs, torch.Generator().manual_seed(seed)))
    valid = inputs.valid.bool().cpu()
    if inputs.row_valid is not None:
        valid = valid & inputs.row_valid.bool().cpu()[:, None]
    compare(before, after, valid, where, _masked_names(inputs), tolerance)


def _masked_names(inputs: MaskedInputs) -> str:
    rows = " and placeholder rows" if inputs.row_valid is not None and not bool(inputs.row_valid.all()) else ""
    return f"the masked positions of {', '.join(inputs.tensors)}{rows}"


# --- credo's own estimators, on Rollouts ------------------------------------------------------------------

ROLLOUT_FIELDS = ("completion_ids", "old_logprobs", "ref_logprobs", "segment_ids", "loss_mask")
"""The per-token Rollouts inputs refilled on padding (outside completion_mask). Every row of a Rollouts is a
sample (no placeholder rows: an empty completion is a real one, its reward in its group), and loss-masked real
tokens (a reset prefix, a tool output) are text the model read, which credit may depend on: neither is refilled."""


def rollout_inputs(rollouts: Rollouts, vocab_size: int | None = None) -> MaskedInputs:
    """The refillable inputs of `rollouts` (ROLLOUT_FIELDS that are set) with their padding as the mask.
    Token ids refill in [0, vocab_size) (default: below the largest id in the batch, so any backend reads them)."""
    present = {name: getattr(rollouts, name) for name in ROLLOUT_FIELDS if getattr(rollouts, name) is not None}
    high = int(vocab_size) if vocab_size else int(rollouts.completion_ids.max()) + 1
    return MaskedInputs(present, rollouts.completion_mask, integer_high={"completion_ids": high})


def folded(credit: Any) -> torch.Tensor:
    """advantages[B, T] x weights x loss_mask of a Credit: what a trainer's loss multiplies."""
    out = credit.advantages
    if credit.weights is not None:
        out = out * credit.weights
    if credit.loss_mask is not None:
        out = out * credit.loss_mask
    return out


def check_estimator_invariance(spec: Any, rollouts: Rollouts, probe: Any, config: Any, where: Any, *,
                               before: torch.Tensor | None = None, seed: int = 0, vocab_size: int | None = None,
                               generator_state: torch.Tensor | None = None, tolerance: float = 0.0) -> None:
    """Masked-perturbation invariance of the registered estimator `spec` (config: its config) on `rollouts`.
    before: its folded credit (`folded`) when the caller has run it; generator_state: probe.generator's state
    before that run, so the recompute samples what the first run sampled (without it, the check runs the
    estimator twice itself). The probe's generator is left where the caller's run left it and the recompute's
    model work is not added to any Credit's cost."""
    generator = getattr(probe, "generator", None)
    if before is None:
        generator_state = generator.get_state() if generator is not None else None
        before = folded(spec(rollouts, probe, config))
    after_first = generator.get_state() if generator is not None else None

    def estimate(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if generator is not None and generator_state is not None:
            generator.set_state(generator_state)
        changed = rollouts.with_fields(**{k: v.to(getattr(rollouts, k).device) for k, v in tensors.items()})
        if probe is None:
            return folded(spec(changed, probe, config))
        with probe.metered():  # the check's own model work: spent, but no estimator's cost
            return folded(spec(changed, probe, config))

    try:
        check_masked_invariance(estimate, rollout_inputs(rollouts, vocab_size), where, seed=seed, before=before,
                                tolerance=tolerance)
    finally:
        if after_first is not None:
            generator.set_state(after_first)
