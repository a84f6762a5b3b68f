"""Premise checks of `credo audit`: can the model do what a method assumes it does? (docs/methods.md,
"## Premise checks").

- Teacher check, for estimators that condition the policy on a verified solution (SC-GRPO's teacher):
  on the audit's held-out traces, every correct trace tau is scored by the teacher (tau in its context,
  exactly as `credit/sc_grpo.py` builds it) and by the plain policy; `gain_per_solution` is the mean of
  log p(tau | teacher context) - log p(tau | prompt) over those traces, `gain_per_token` the summed gain
  over their summed tokens. A teacher that cannot read its context scores its own solution lower with it
  in context (gain < 0): its KL then measures confusion, not pivotal tokens. `kl_argmax_in_first_error`:
  over wrong traces with a labelled first wrong step and a correct trace in their group (the teacher's
  tau, as SC-GRPO draws one), the share whose largest KL(teacher || student) token lies in that step;
  `kl_argmax_uniform` is the share a token drawn uniformly would get.
- Localisation check (audit_localisers in credo.lab.audit.run): each localiser's first-error top-1 and step-1
  share, against a uniform guess (`random_top1_expectation`) and the oracle's step-1 share; the `prompt`
  localiser (and `self` where it asks) is the trainer's own call on the policy, and its `parse_rate` is
  the share of replies the parser read (not its step-1 fallback).
- Privileged twins: an estimator run with the task's reference solution is also run without it, side by
  side (`rredcot` and `rredcot:include_reference=false`).
None of these refuses anything: they are rows of the report, and a negative teacher gain one warning line.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Sequence

import torch

from credo import credit
from credo.core.probe import Probe
from credo.core.segment import default_segmenter, segment_bounds
from credo.credit.sc_grpo import self_conditioned_kl, teacher_prompt
from credo.lab.audit.localisation import pick_figures
from credo.lab.audit.report import labelled_errors
from credo.strategies.localisers import localise
from credo.strategies.resets import ResetConfig
from credo.strategies.sampling import sample_scored
from credo.train import methods


TEACHER_ESTIMATORS = ("sc_grpo",)
"""Estimators that condition the policy on one of its verified solutions (the teacher check applies)."""


def conditions_on_solution(name: str, config: Any) -> bool:
    """Whether estimator `name` with `config` has a teacher conditioned on a verified solution (a shuffled
    control inherits it from the method it wraps)."""
    if name == "shuffled":
        return conditions_on_solution(config.of, None)
    return name in TEACHER_ESTIMATORS


def teacher_gain(rollouts: Any, policy: Any, task: Any) -> dict[str, float]:
    """log p(tau | teacher context) - log p(tau | prompt) over the correct traces tau of `rollouts` (module
    docstring): {'solutions', 'gain_per_solution', 'gain_per_token', 'teacher_logp_per_solution',
    'student_logp_per_solution'}; NaN figures when no trace is correct."""
    rows = [i for i in range(rollouts.batch_size) if bool(rollouts.correct[i])]
    nan = float("nan")
    if not rows:
        return {"solutions": 0, "gain_per_solution": nan, "gain_per_token": nan,
                "teacher_logp_per_solution": nan, "student_logp_per_solution": nan}
    comp_ids, comp_mask = rollouts.completion_ids[rows], rollouts.completion_mask[rows]
    width = comp_ids.shape[1]
    prompts = [teacher_prompt(task, policy, rollouts.problems[i], rollouts.completions[i], width, None, i)
               for i in rows]
    t_ids, t_mask = policy.encode_prompts(prompts)
    with torch.no_grad():
        teacher, _ = policy.score(t_ids, t_mask, comp_ids, comp_mask)
        student, _ = policy.score(rollouts.prompt_ids[rows], rollouts.prompt_mask[rows], comp_ids, comp_mask)
    t_sum, s_sum = teacher.sum(1).double(), student.sum(1).double()
    tokens = float(comp_mask.sum())
    return {"solutions": len(rows), "gain_per_solution": float((t_sum - s_sum).mean()),
            "gain_per_token": float((t_sum - s_sum).sum()) / max(tokens, 1.0),
            "teacher_logp_per_solution": float(t_sum.mean()), "student_logp_per_solution": float(s_sum.mean())}


def kl_argmax_hits(rollouts: Any, segment_ids: torch.Tensor, first: Sequence[int | None],
                   probe: Any) -> dict[str, float]:
    """Over wrong traces with a labelled first wrong step e and a correct trace in their group: the share whose
    largest per-token KL(teacher || student) lies in step e, and the share a uniform token would get."""
    rows, refs = [], []
    for i, e in enumerate(first):
        if e is None or bool(rollouts.correct[i]):
            continue
        same = [j for j in range(rollouts.batch_size) if int(rollouts.group[j]) == int(rollouts.group[i])
                and bool(rollouts.correct[j])]
        if same and bool((segment_ids[i] == e).any()):
            rows.append(i)
            refs.append(same[0])
    if not rows:
        return {"kl_traces": 0, "kl_argmax_in_first_error": float("nan"), "kl_argmax_uniform": float("nan")}
    with torch.no_grad():
        kl = self_conditioned_kl(rollouts, probe, rows, refs, chunk_rows=64)
    hits, uniform = 0, 0.0
    for j, i in enumerate(rows):
        mask = rollouts.completion_mask[i]
        scores = kl[j].masked_fill(~mask, -1.0)
        hits += int(segment_ids[i, int(scores.argmax())] == first[i])
        uniform += float(((segment_ids[i] == first[i]) & mask).sum()) / max(float(mask.sum()), 1.0)
    return {"kl_traces": len(rows), "kl_argmax_in_first_error": hits / len(rows),
            "kl_argmax_uniform": uniform / len(rows)}


def teacher_warning(check: dict[str, float]) -> str | None:
    """The one-line warning when the teacher scores its own verified solutions lower with them in context."""
    gain = check.get("gain_per_solution", float("nan"))
    if not gain < 0:
        return None
    return (f"warning: the teacher scores its own verified solutions {-gain:.1f} nats lower with them in context "
            f"({check['solutions']} solutions): SC-GRPO's KL weights measure its confusion, not pivotal tokens "
            "(docs/methods.md, 'Premise checks')")


def teacher_table(check: dict[str, float]) -> str:
    """The teacher check as a markdown section of audit.md."""
    lines = ["## Premise: the teacher reads its verified solution", "",
             "| solutions | gain / solution (nats) | gain / token | log p teacher / solution | log "
             "p student / solution | wrong traces | KL argmax in first wrong step | uniform token |",
             "|---|---|---|---|---|---|---|---|",
             f"| {check['solutions']} | {check['gain_per_solution']:+.3f} | {check['gain_per_token']:+.4f} | "
             f"{check['teacher_logp_per_solution']:.3f} | {check['student_logp_per_solution']:.3f} | "
             f"{check['kl_traces']} | {check['kl_argmax_in_first_error']:.3f} | {check['kl_argmax_uniform']:.3f} |"]
    warning = teacher_warning(check)
    return "\n".join(lines + (["", f"**{warning}**"] if warning else [])) + "\n"


def unprivileged_twins(methods: list[tuple[str, str, Any]]) -> list[tuple[str, str, Any]]:
    """`methods` (label, estimator name, config), each RREDCoT that reads the reference solution followed by
    its twin without it (`<label>:include_reference=false`), unless that config is already requested."""
    out = []
    for label, name, config in methods:
        out.append((label, name, config))
        if name != "rredcot" or config.candidates != "suffixes" or not config.include_reference:
            continue
        twin = replace(config, include_reference=False)
        if not any(n == name and c == twin for _, n, c in methods):
            out.append((f"{label}:include_reference=false", name, twin))
    return out


def premises_of(method: str) -> tuple[bool, str | None]:
    """Which premise checks a compared method rests on: (the teacher check applies, the localiser it asks the
    policy with or None). A reset recipe's `prompt` or `self` localiser asks the policy; the others do not."""
    recipe = methods.resolve(method)
    spec = credit.get(recipe.estimator)
    teacher = conditions_on_solution(recipe.estimator, spec.make_config(recipe.defaults.get("credit", {})))
    localiser = None
    if recipe.defaults.get("strategy") == "resets":
        localiser = recipe.defaults.get("reset", {}).get("localiser", ResetConfig().localiser)
    return teacher, localiser if localiser in ("prompt", "self") else None


def measure_premises(policy: Any, task: Any, problems: Sequence[Any], group_size: int, sampling: Any, seed: int,
                     teacher: bool, localisers: Sequence[str], prompt_max_new_tokens: int = 4096) -> dict[str, Any]:
    """The premise checks on `policy` without a Monte Carlo reference (what a comparison measures on each run's
    final policy, and on its start, since RL may erode them): traces of `problems` x `group_size` sampled with
    `sampling`; with `teacher`, the teacher check (teacher_gain, kl_argmax_hits); for each localiser, on wrong
    traces with a labelled first wrong step, the first-error top-1, the step-1 share, the parse rate of the
    policy's replies, and the uniform guess's expected top-1 (localisation_figures), the `prompt` localiser's
    replies cut at `prompt_max_new_tokens` (SRPO's 4096 by default). -> {'traces', 'accuracy', 'teacher'?,
    'localisers'?}."""
    with torch.no_grad():
        rollouts = sample_scored(policy, task, problems, group_size, sampling, torch.Generator().manual_seed(seed))
        probe = Probe(policy, task, sampling, torch.Generator().manual_seed(seed + 1))
        segment_ids = probe.segment(rollouts, default_segmenter(task))
        rollouts = rollouts.with_fields(segment_ids=segment_ids)
        first, slips = labelled_errors(task, rollouts)
        out: dict[str, Any] = {"traces": rollouts.batch_size, "accuracy": float(rollouts.correct.float().mean())}
        if teacher:
            out["teacher"] = {**teacher_gain(rollouts, policy, task),
                              **kl_argmax_hits(rollouts, segment_ids, first, probe)}
        if localisers:
            out["localisers"] = localisation_figures(rollouts, segment_ids, first, probe, localisers, seed, slips,
                                                     prompt_max_new_tokens)
    return out


def localisation_figures(rollouts: Any, segment_ids: torch.Tensor, first: Sequence[int | None], probe: Any,
                         localisers: Sequence[str], seed: int, slips: Sequence[str | None] = (),
                         prompt_max_new_tokens: int = 4096) -> dict[str, Any]:
    """Per localiser, on the wrong traces with a labelled first wrong step (on a task without step labels: every
    wrong trace, and no top-1), the first-error top-1, step-1 share, parse rate and their floors, and, as SRPO
    uses it, where it resets beside where the first errors lie and its top-1 by position and by the kind of
    the first error (`slips`, one per trace; pick_figures); NaN figures where there is no such trace;
    {'failure': why} for a localiser that cannot run (reported, never raised)."""

    nan = float("nan")
    labels = getattr(probe.task, "has_step_labels", False)
    n_steps = [len(b) for b in segment_bounds(segment_ids)]
    rows = ([i for i, f in enumerate(first) if f is not None and f < n_steps[i]] if labels
            else [i for i in range(rollouts.batch_size) if not bool(rollouts.correct[i]) and n_steps[i] > 0])

    def share(values: Sequence[float]) -> float:
        return sum(values) / len(values) if values else nan

    out: dict[str, Any] = {}
    for name in localisers:
        if not rows:
            out[name] = {"traces": 0, "localisation_top1": nan, "step1_share": nan, "oracle_step1_share": nan,
                         "random_top1_expectation": nan, "parse_rate": nan}
            continue
        notes: dict[str, Any] = {}
        try:
            picks = localise(name, rollouts, rows, probe, segment_ids, random.Random(seed), notes=notes,
                             prompt_max_new_tokens=prompt_max_new_tokens)
        except Exception as err:  # noqa: BLE001 (e.g. a policy that cannot read the request: reported, not raised)
            out[name] = {"failure": f"{type(err).__name__}: {err}"}
            continue
        out[name] = {"traces": len(rows), "step1_share": share([k == 0 for k in picks]),
                     "localisation_top1": share([k == first[i] for k, i in zip(picks, rows)]) if labels else nan,
                     "oracle_step1_share": share([first[i] == 0 for i in rows]) if labels else nan,
                     "random_top1_expectation": share([1 / n_steps[i] for i in rows]) if labels else nan,
                     **parse_figures(notes)}
        if labels:
            truth = [first[i] for i in rows]
            out[name] |= {**pick_figures(picks, truth, [slips[i] for i in rows] if slips else ()),
                          "oracle_share_by_step": pick_figures(truth, truth)["share_by_step"]}
    return out


def parse_figures(notes: dict[str, Any]) -> dict[str, Any]:
    """What a localiser decided on the way (credo.strategies.localisers.Parents.notes): `resolved` (the
    localiser `self` ran) and, for one that asks the policy, `parse_rate` = share of replies the parser read
    (a boxed or a 'Step N' answer, not the step-1 fallback); NaN for a localiser that asks nothing."""
    rules = notes.get("parse_rules")
    rate = sum(rule != "fallback" for rule in rules) / max(len(rules), 1) if rules is not None else float("nan")
    return {"parse_rate": rate, **({"resolved": notes["resolved"]} if "resolved" in notes else {})}
