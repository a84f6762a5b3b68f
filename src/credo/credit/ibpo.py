"""IBPO: implicit process advantages from counterfactual comparison inside a group.

An incorrect trajectory w is compared with the most similar correct one c* of its group (token
alignment, difflib's matching blocks). Where they differ is the implicit alternative decision:
  regions=first (default): only the FIRST differing region, E_w = its tokens in w and E_c = its
    counterpart in c*; later regions merely carry that difference forward (an arith slip "=86"
    makes every later line differ too) and are not new decisions. When the region is empty on one
    side (a pure insertion or deletion), that side's token at the divergence point stands for it
    (ours: the token it wrote instead);
  regions=all: every replaced/deleted span of w and replaced/inserted span of c* (an ablation);
  A_{w,t} = A_w on E_w and kappa * A_w elsewhere (kappa = 0, the paper: only edited tokens get
  credit); the same for c* on E_c (the union over every incorrect trajectory that chose it).
  Correct trajectories no one chose keep their GRPO advantage.
  preserve_mass (ours, off) rescales each reshaped row so sum_t A_t = |o| * A (the GRPO total): the
  paper's raw totals make IBPO a ~0.4x-step GRPO at the same learning rate, but the rescaling puts 35-70x
  GRPO's advantage on one or two tokens and was measured worse (docs/methods.md, IBPO).
Groups with no correct or no incorrect member get plain GRPO.
mode=correct (ours for models that cannot follow a repair instruction): w is resampled
`repair_tries` times from the first token where it diverges from c*; the first continuation that
verifies is the repair, and its diff against w defines E_w. When no repair verifies, the row falls
back to alignment. Cost: alignment is free; correct mode generates the repair continuations.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import torch

from credo.core.config import check
from credo.core.groups import group_rows, grpo_advantages
from credo.credit.registry import register
from credo.core.values import continue_and_verify
from credo.policy.base import strip_eos
from credo.core.probe import Probe, prompt_tokens
from credo.core.rollouts import Credit, Rollouts


@dataclass(frozen=True)
class IBPOConfig:
    """IBPO's implicit process advantages (module docstring)."""

    mode: str = "alignment"
    """How an incorrect trace's edited tokens are found: 'alignment' (its diff against the most similar correct
    member of its group; free) or 'correct' (the first verified resampled repair of it; costs generation)."""
    regions: str = "first"
    """'first': only the first differing region (the paper's single implicit decision); 'all': every differing
    span (an ablation)."""
    kappa: float = 0.0
    """Share of the row's advantage that unedited tokens keep, in [0, 1] (0: the paper, only edited tokens get
    credit; 1: GRPO)."""
    preserve_mass: bool = False
    """true (ours): rescale each reshaped row so its advantage total equals GRPO's (|o| * A); false (the
    paper): IBPO's raw totals, a ~0.4x-step GRPO at the same learning rate."""
    repair_tries: int = 2
    """mode=correct: continuations sampled per incorrect trace to find a repair (>= 1)."""

    def __post_init__(self) -> None:
        check(self.mode in ("alignment", "correct"), f"credit.mode must be 'alignment' or 'correct', got {self.mode!r}")
        check(self.regions in ("first", "all"), f"credit.regions must be 'first' or 'all', got {self.regions!r}")
        check(0 <= self.kappa <= 1, f"credit.kappa must be in [0, 1], got {self.kappa}")
        check(self.repair_tries >= 1, f"credit.repair_tries must be >= 1, got {self.repair_tries}")


def edited_sets(wrong: list[int], right: list[int]) -> tuple[set[int], set[int]]:
    """Token positions of `wrong` in replaced/deleted spans and of `right` in replaced/inserted spans."""
    matcher = difflib.SequenceMatcher(a=wrong, b=right, autojunk=False)
    e_w, e_c = set(), set()
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            e_w.update(range(i1, i2))
        if tag in ("replace", "insert"):
            e_c.update(range(j1, j2))
    return e_w, e_c


def first_edit(wrong: list[int], right: list[int]) -> tuple[set[int], set[int]]:
    """Token positions of the first differing region: its span in `wrong` and its counterpart in
    `right`. An empty side (pure insertion/deletion) is the token at the divergence point, if any."""
    matcher = difflib.SequenceMatcher(a=wrong, b=right, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        e_w = set(range(i1, i2)) or ({i1} if i1 < len(wrong) else set())
        e_c = set(range(j1, j2)) or ({j1} if j1 < len(right) else set())
        return e_w, e_c
    return set(), set()


def similarity(a: list[int], b: list[int]) -> float:
    return difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio()


def first_divergence(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def repair_edits(rollouts: Rollouts, probe: Probe, pairs: list[tuple[int, int]], tokens: list[list[int]],
                 tries: int, edits=edited_sets) -> dict[int, set[int]]:
    """For (wrong row, chosen correct row) pairs: resample w from its divergence point; the edited set
    of the first verified repair, per wrong row (rows without a verified repair are absent)."""
    jobs = []
    for w, c in pairs:
        d = first_divergence(tokens[w], tokens[c])
        prefix = tokens[w][:d]
        for _ in range(tries):
            jobs.append((w, prefix))
    if not jobs:
        return {}
    policy = probe.policy
    out = continue_and_verify(probe.sample, policy, probe.task, [rollouts.problems[w] for w, _ in jobs],
                              [prompt_tokens(rollouts.prompt_ids, rollouts.prompt_mask, w) for w, _ in jobs],
                              [prefix for _, prefix in jobs], rollouts.prompt_ids.device)
    found: dict[int, set[int]] = {}
    for (w, _), full, good in zip(jobs, out.tokens, out.correct.tolist()):
        if good and w not in found:
            found[w] = edits(tokens[w], strip_eos(full, policy.eos_id))[0]
    return found


@register("ibpo", "IBPO: credit on the tokens where an incorrect trace differs from its most similar correct one",
          IBPOConfig, uses_model=False)
def ibpo(rollouts: Rollouts, probe: Probe | None, config: IBPOConfig) -> Credit:
    if config.mode == "correct" and probe is None:
        raise ValueError("ibpo mode=correct generates repairs: pass a Probe")
    a = grpo_advantages(rollouts.rewards, rollouts.group)
    mask = rollouts.trainable_mask()
    tokens = [row[m].tolist() for row, m in zip(rollouts.completion_ids, rollouts.completion_mask)]
    groups = group_rows(rollouts.group)
    correct = rollouts.correct.tolist()
    edits = first_edit if config.regions == "first" else edited_sets
    pairs, edits_w, edits_c = [], {}, {}
    for members in groups.values():
        good = [i for i in members if correct[i]]
        bad = [i for i in members if not correct[i]]
        if not good or not bad:
            continue
        for w in bad:
            c = max(good, key=lambda j: (similarity(tokens[w], tokens[j]), -j))
            e_w, e_c = edits(tokens[w], tokens[c])
            pairs.append((w, c))
            edits_w[w] = e_w
            edits_c.setdefault(c, set()).update(e_c)
    repaired = 0
    if config.mode == "correct" and pairs:
        found = repair_edits(rollouts, probe, pairs, tokens, config.repair_tries, edits)
        edits_w.update(found)
        repaired = len(found)
    scale = torch.ones_like(mask, dtype=torch.float32)
    for row, edited in list(edits_w.items()) + list(edits_c.items()):
        if not edited:  # nothing of this row differs (a strict prefix of its partner): keep GRPO
            continue
        row_scale = torch.full((mask.shape[1],), config.kappa)
        row_scale[list(edited)] = 1.0
        scale[row] = row_scale
    advantages = a[:, None] * scale * mask
    if config.preserve_mass:
        n = mask.sum(1).float()
        total = advantages.sum(1)
        target = a * n
        factor = torch.where(total.abs() > 1e-12, target / total, torch.ones_like(total))
        advantages = advantages * factor[:, None]
    return Credit(advantages=advantages, info={"pairs": float(len(pairs)), "repaired": float(repaired)})
