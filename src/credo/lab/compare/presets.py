"""What a comparison runs: the presets, the config of each (method, seed) run, and the protocol
results.json records (the schedule each method trained with, the evaluation sets).

A method in a preset is a name or a spec with options, 'shuffled:of=rredcot'; its options become the
estimator's credit options. Every method shares one optimiser schedule (epochs x mini-batches per batch)
and one learning rate; a recipe that sets its own (a paper's setting) keeps it, and the protocol marks it.
The `long` preset's token budget is where GRPO's curve on arith-long's start flattens (docs/results/arith-long-grpo).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from credo.train import methods as method_registry
from credo.credit.registry import parse_spec
from credo.core.config import (SEED_LIMIT, ConfigError, parse_yaml_value, to_dict)
from credo.tasks import make_task
from credo.train.config import TrainConfig, comparable_config, config_from_run
from credo.train.methods import RECIPES, resolve
from credo.train.plan import Plan, load_train_config, plan_run
from credo.core.config import config_hash
from credo.train.sft_config import sft_config_for

IBPO_AS_RUN = "ibpo:preserve_mass=true"
"""IBPO as the committed grids ran it: mass preserved, the default until it was measured worse (docs/methods.md)."""
GTPO_AS_RUN = "gtpo:form=weights"
"""GTPO as the committed beyond grid ran it: entropy weights on GRPO's advantage, the default until the paper's
form was built (docs/methods.md)."""
ALL_METHODS = ("grpo", "dr_grpo", "rloo", "dapo", "gspo", "vineppo", "spo_chain", "rredcot", IBPO_AS_RUN,
               "sc_grpo", "rrpo", "srpo")
MAX_GRAD_CLIP = 1e6  # a clip norm above any real gradient: clipping off
SCHEDULE = ("epochs", "minibatches", "lr", "grad_clip")  # the optimiser schedule every method of a comparison shares
MAX_JOBS = 256  # runs at a time: each is a process holding a policy; more is a typo, not a machine
CREDO_METHOD = "tempo:of=rredcot:include_reference=false"
"""The credo method: chosen by the rule of docs/methods.md on the validation split, seed 10
(docs/results/beyond-seeds/selection/: 0.666 against tempo:of=rredcot † 0.671, within one standard error, and
entropy_mask:of=rredcot:include_reference=false 0.660; GRPO 0.629). Unprivileged: RREDCoT's own-group value."""
CREDO_CONTROL = "shuffled:of=tempo:options.of=rredcot:include_reference=false"
"""Its shuffled control (segment level: the credit is RREDCoT's segment credit plus the trie's token term)."""


@dataclass(frozen=True)
class Preset:
    """A comparison's protocol: what runs, on what budget, evaluated how (`credo compare --preset NAME`)."""

    methods: tuple[str, ...]
    """What to run: each a method name or 'name:key=value' (e.g. 'shuffled:of=rredcot')."""
    seeds: tuple[int, ...]
    """Seeds of every method."""
    token_budget: int
    """Generated tokens per run."""
    eval_every_tokens: int
    """Held-out accuracy whenever generated tokens cross a multiple of it (the shared accuracy curve)."""
    eval_n: int
    """Held-out problems of each curve point."""
    final_eval_n: int
    """Held-out problems of the final evaluation."""
    train: dict[str, Any] = field(default_factory=dict)
    """TrainConfig overrides for every run."""
    audit_n: int = 64
    """Traces of the credit audit of the start (0 skips it)."""
    audit_k_ref: int = 16
    """MC continuations per boundary of the audit's reference."""
    premise_n: int = 0
    """Traces (8 per held-out problem) of the premise checks measured on the start and on every run's final
    policy, for the methods that rest on one (the teacher check for SC-GRPO and its controls, the localisation
    check for a reset method that asks the policy): RL may erode them (0 skips them)."""
    task: str = "arith"
    """The task every run trains and is evaluated on (its default start unless --start is given)."""
    schedule: dict[str, Any] = field(default_factory=dict)
    """epochs/minibatches/lr shared by every method (empty: TrainConfig's defaults)."""
    jobs: int = 1
    """Trainings at once unless --jobs says otherwise."""
    note: str = ""
    """Said in results.json and the report (e.g. that a budget is not measured yet)."""
    needs_start: str = ""
    """What --start must be, for a preset whose task has no default start ('' = the task's default start)."""


PRESETS = {
    # `make demo`, a few minutes on 2 cores: what a user would deploy (the baseline, the credo method, SC-GRPO) and
    # one privileged row as the ceiling (RREDCoT with the reference solution in its value)
    "quick": Preset(methods=("grpo", CREDO_METHOD, "sc_grpo", "rredcot"), seeds=(0,), token_budget=230_000,
                    eval_every_tokens=57_500, eval_n=200, final_eval_n=1000, audit_n=64, audit_k_ref=16),
    # every method and the shuffled controls of the cheap segment-credit methods, 3 seeds, ~114 GRPO steps
    # (the 12 methods took 58 minutes on 2 cores with --jobs 2)
    "full": Preset(methods=ALL_METHODS + ("shuffled:of=rredcot", "shuffled:of=sc_grpo"), seeds=(0, 1, 2),
                   token_budget=260_000, eval_every_tokens=65_000, eval_n=300, final_eval_n=1000, audit_n=128,
                   audit_k_ref=16, jobs=2),
    # The decisive comparison on the long-chain task. Budget measured on arith-long's start
    # (docs/results/arith-long-grpo/wide): GRPO climbs fast to ~400k tokens (0.36 -> 0.56), a third as fast to
    # 1M (0.63), and is flat from 1M to 1.5M (0.63, 0.63, 0.62, 0.62, 0.64): the budget is where it flattens.
    "long": Preset(methods=("grpo", "dr_grpo", "dapo", "gspo", "rredcot", "shuffled:of=rredcot", "vineppo", "rrpo",
                            "srpo", IBPO_AS_RUN, "sc_grpo", "shuffled:of=sc_grpo"), seeds=(0, 1, 2, 3, 4),
                   token_budget=1_000_000, eval_every_tokens=125_000, eval_n=300, final_eval_n=1000, audit_n=128,
                   audit_k_ref=16, task="arith-long", jobs=2),
    # SmolLM2-135M on 2 CPU cores: gym:chain_sum with 3-4 one-digit terms, from its format/answer SFT
    # start (README, "Real models"), which the caller passes as --start. One update per batch of 2 prompts x 4
    # completions at lr 2e-6 (2e-5 collapsed the start's greedy accuracy 0.33 -> 0 within 10 steps, see
    # docs/results/smollm2/); 50k generated tokens is ~205 GRPO steps, ~24 minutes of one GRPO run on 2 idle cores
    # (docs/results/smollm2/grpo-42k-timed).
    "smollm2": Preset(methods=("grpo", "rredcot", "sc_grpo"), seeds=(0, 1), token_budget=50_000,
                      eval_every_tokens=10_000, eval_n=100, final_eval_n=300, audit_n=0, task="gym:chain_sum",
                      train={"task_options": {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 1}},
                      schedule={"epochs": 1, "minibatches": 1, "lr": 2e-6}, jobs=2,
                      needs_start="the SmolLM2 format/answer SFT start: `credo sft --config "
                                  "examples/smollm2/sft.yaml --out DIR` (README, Real models and tasks)"),
    # Round two, grid 1: the claims judged on the skilled arith-long start, where the mechanisms can work:
    # rredcot with and without the reference solution (privileged with it), sc_grpo and its token-level control, srpo
    # with the paper's self-localisation (`prompt`) and with `value` (privileged), ibpo with and without mass
    # preservation. Budget measured on sft:arith-long-skilled-band (docs/results/long-skilled-band-grpo-1m): GRPO is
    # flat to 500k tokens, climbs to ~0.65 by 875k and is flat from 1M to 1.5M (0.663, 0.660 on 1000 problems).
    "long-skilled": Preset(methods=("grpo", "dr_grpo", "dapo", "rredcot", "rredcot:include_reference=false",
                                    "shuffled:of=rredcot", "sc_grpo", "shuffled:of=sc_grpo:level=token",
                                    "srpo:localiser=prompt", "srpo:localiser=value", "rrpo", IBPO_AS_RUN,
                                    "ibpo:preserve_mass=false"), seeds=(0, 1, 2, 3, 4),
                           token_budget=1_000_000, eval_every_tokens=125_000, eval_n=300, final_eval_n=1000,
                           audit_n=128, audit_k_ref=16, premise_n=64, task="arith-long", jobs=2,
                           note="budget: 1M tokens, where GRPO's curve flattens on sft:arith-long-skilled-band "
                                "(1 seed, flat from 1M to 1.5M: docs/results/long-skilled-band-grpo-1m)",
                           needs_start="a skilled arith-long start: --start sft:arith-long-skilled-band (its teacher "
                                       "reads its solution, greedy 0.60: room for RL) or sft:arith-long-skilled (0.83: "
                                       "GRPO does not improve it)"),
    # Round two, grid 2: SmolLM2-135M on longer chains (5-8 one-digit terms), from its skilled start on them: the
    # long-skilled grid's methods (its baselines, the credit methods with their controls, the credo method), each run
    # on LoRA adapters alike (`--set lora.r=16`) from the skilled adapter start.
    "smollm2-long": Preset(methods=("grpo", "dr_grpo", "dapo", "rredcot", "rredcot:include_reference=false",
                                    "shuffled:of=rredcot", "sc_grpo", "shuffled:of=sc_grpo:level=token",
                                    "srpo:localiser=prompt", "rrpo", "ibpo", CREDO_METHOD),
                           # 75k, not the 150k where GRPO's validation curve levelled: a run must finish within
                           # one working session of a 2-core CPU (~2.9 h; the slowest method's run at 75k is ~2.5 h)
                           # because only what is committed survives a change of machine, and a checkpoint does not
                           seeds=(0, 1, 2), token_budget=75_000, eval_every_tokens=18_750, eval_n=100,
                           final_eval_n=300, audit_n=0, premise_n=32, task="gym:chain_sum",
                           # step_labels: the localisation premise check needs each trace's first wrong line
                           train={"task_options": {"min_terms": 5, "max_terms": 8, "min_digits": 1,
                                                   "max_digits": 1, "step_labels": True},
                                  # 96: the start's own evaluation and audit; at the CPU default of 64 the worked
                                  # solutions of 30% of the problems (nearly every 8-term chain) do not fit
                                  "sampling": {"max_new_tokens": 96},
                                  "checkpoint_every": 10},  # ~5 minutes of CPU steps; an adapter's is ~60 MB
                           # lr: GRPO's on the adapter start, chosen on the validation split
                           # (docs/results/smollm2-long/README.md): 6e-5 beat 2e-5 (0.377 vs 0.343 on 300
                           # problems at 150k tokens; start 0.283; at 75k 0.40 vs 0.37 on the 100-problem curve)
                           schedule={"epochs": 1, "minibatches": 1, "lr": 6e-5}, jobs=2,
                           note="learning rate measured on GRPO with LoRA rank 16 (validation split); budget half "
                                "the 150k where its curve levelled, so that a run fits one session of a 2-core CPU: "
                                "GRPO still climbs at this budget",
                           needs_start="the skilled SmolLM2 start on 5-8 term chains: the adapter `credo sft "
                                       "--config examples/smollm2/sft-long-skilled-lora.yaml --out DIR` (the "
                                       "comparison then takes --set lora.r=16), or the full-weight one of "
                                       "examples/smollm2/sft-long.yaml "
                                       "then sft-long-skilled.yaml (held-out greedy 0.39; its teacher reads its "
                                       "solution, its localisation is at chance)"),
    # for tests: a minute on a tiny model
    "smoke": Preset(methods=("grpo", "rredcot"), seeds=(0,), token_budget=1_500, eval_every_tokens=600, eval_n=8,
                    final_eval_n=8, train={"prompts_per_step": 2, "group_size": 4, "sampling": {"max_new_tokens": 24}},
                    audit_n=8, audit_k_ref=2),
}
# Beyond the seeds: the free and cheap methods users compare against and the credo method, on the `long`
# protocol itself (so its grpo and rredcot runs are the long grid's), with controls and no start audit. The credo
# method is the one the rule of docs/methods.md chose on the validation split (docs/results/beyond-seeds/selection/),
# before this ran.
# DAPO's recipe with credit: on the skilled start DAPO is the strongest row (+2.5 over GRPO) and ties or beats every
# credit method, and users run DAPO-style recipes; does any credit add to it? The long-skilled protocol, with DAPO's
# settings (clip-higher, token-mean, dynamic sampling, fitted overlong penalty) on each method's credit.
PRESETS["dapo-credit"] = replace(PRESETS["long-skilled"], methods=(
    "grpo", "dapo", "dapo:of=rredcot:options.include_reference=false",
    "dapo:of=tempo:options.of=rredcot:options.include_reference=false", "dapo:of=ibpo:options.preserve_mass=false",
    "dapo:of=sc_grpo"),
    note="the long-skilled protocol and budget, every method on DAPO's recipe (dapo:of=<estimator>)")
PRESETS["beyond"] = replace(PRESETS["long"], audit_n=0, methods=(
    "grpo", "rredcot", "tempo", "lambda_grpo", "entropy_mask", GTPO_AS_RUN, "otb", "prefix_shaping", CREDO_METHOD,
    CREDO_CONTROL, "shuffled:of=tempo:level=token"))


def run_dir_name(spec: str, seed: int) -> str:
    """runs/<name>-s<seed>; a spec's ':' (not allowed in every file system) becomes '_'."""
    return f"{spec.replace(':', '_')}-s{seed}"


def run_plan(spec: str, seed: int, preset: Preset, start: str,
             report_to: tuple[str, ...] = ()) -> tuple[TrainConfig, Plan]:
    """The TrainConfig of one run, and its plan (credo.train.plan.plan_run): the preset's shared settings and
    schedule, the method's recipe, and the spec's options as the estimator's credit options. The shared schedule
    goes under the recipe: a recipe that sets its own schedule (a paper's setting) keeps it in any comparison.
    report_to: the run's trackers. A reset recipe's `localiser` option (srpo:localiser=prompt) is its reset's
    localiser, not a credit option."""
    name, options = parse_spec(spec)
    if name in RECIPES and "of" in options:  # 'dapo:of=rredcot:...': the spec is the method, its options the recipe's
        name, options = spec, {}
    reset = {}
    if "localiser" in options and resolve(name).defaults.get("strategy") == "resets":
        reset = {**preset.train.get("reset", {}), "localiser": options.pop("localiser")}
    credit = {**preset.train.get("credit", {}), **{k: parse_yaml_value(v, f"method {spec} option {k}")
                                                   for k, v in options.items()}}
    # checkpoints every 50 steps unless the preset says otherwise (a tiny-GPT step takes a second; a SmolLM2
    # step tens of seconds, whose preset checkpoints more often so a stopped grid loses minutes, not half an hour)
    overrides = {"checkpoint_every": 50, **preset.train, "method": name, "seed": seed, "start": start,
                 "task": preset.task, "steps": 1_000_000, "max_generated_tokens": preset.token_budget,
                 "eval_every_tokens": preset.eval_every_tokens, "eval_n": preset.eval_n,
                 "final_eval_n": preset.final_eval_n, "report_to": list(report_to)}
    if credit:
        overrides["credit"] = credit
    if reset:
        overrides["reset"] = reset
    return plan_run(None, None, overrides, base=dict(preset.schedule))


def run_config(spec: str, seed: int, preset: Preset, start: str, report_to: tuple[str, ...] = ()) -> TrainConfig:
    """run_plan's config alone: what a run records, for the checks and records that read it."""
    return run_plan(spec, seed, preset, start, report_to)[0]


def protocol(preset: Preset, start: str, jobs: int) -> dict[str, Any]:
    """What every run shared and where a method differs, as results.json records it. Each method's schedule
    is read back from its own run config, so what is recorded is what trains; a method whose recipe sets a
    different schedule is marked source 'recipe'."""
    base = load_train_config(None, None, {**preset.schedule, "start": start})  # no recipe: the shared schedule
    validation = preset.train.get("eval_split") == "validation"
    split = "validation" if validation else "held-out"
    shared = {k: getattr(base, k) for k in SCHEDULE}
    per_method = {}
    for spec in preset.methods:
        config = run_config(spec, preset.seeds[0], preset, start)
        own = {k: getattr(config, k) for k in SCHEDULE}
        per_method[spec] = {**own, "source": "shared" if own == shared else "recipe"}
    return {"task": preset.task, "seeds": list(preset.seeds), "jobs": jobs, "token_budget": preset.token_budget,
            "eval_every_tokens": preset.eval_every_tokens, "eval_n": preset.eval_n,
            "final_eval_n": preset.final_eval_n, "curve_eval_set": f"the first {preset.eval_n} {split} problems",
            "schedule": shared, "methods": per_method, **({"eval_split": "validation"} if validation else {}),
            **({"lora": dict(preset.train["lora"])} if preset.train.get("lora", {}).get("r") else {}),
            # recorded only off float32 (bfloat16-mixed), so the results of float32 comparisons keep their bytes
            **({"dtype": preset.train["dtype"]} if preset.train.get("dtype", "float32") != "float32" else {})}


def is_default_start(path: str, task: str) -> bool:
    """Whether `path` names the task's default start by its folder: the shipped `assets/sft-<hash>` or the
    cache's `sft/<hash>` (credo.train.sft.ensure_sft), in this checkout or any other. The hash names the SFT config,
    and SFT on CPU is deterministic, so every such folder holds the same start."""
    if not path:
        return False
    digest = config_hash(sft_config_for(task))
    folder = os.path.normpath(str(path))
    name, parent = os.path.basename(folder), os.path.basename(os.path.dirname(folder))
    return name == f"sft-{digest}" or (name == digest and parent == "sft")


def check_reusable(plan: list[tuple[str, int, str]], preset: Preset, start: str) -> None:
    """A run directory left by an earlier comparison is reused (or resumed) only if it was made with
    the same training config; otherwise mixing budgets or starts would corrupt the table. Both configs are
    compared as loaded (an older config.yaml's flat sampling keys and partial credit options included).
    Runs record the task's default start as ''; a run from before that, or a --start, naming a path to it
    (in whatever checkout or cache it lay) is the same start here, though it trains from the path given."""
    for method, seed, run_dir in plan:
        if not os.path.exists(os.path.join(run_dir, "config.yaml")):
            continue
        old = comparable_config(to_dict(config_from_run(run_dir)))  # default-valued credit options as such
        new = comparable_config(to_dict(run_config(method, seed, preset, start)))
        for recorded in (old, new):  # the default start named by a path (another checkout's, the cache's) is ''
            if is_default_start(recorded.get("start", ""), preset.task):
                recorded["start"] = ""
        # where a run reports to is not what it trains: a comparison may add or drop trackers and reuse its runs;
        # nor is how often a finished run checkpointed (a part-way one resumes from checkpoints it made)
        done = os.path.exists(os.path.join(run_dir, "summary.json"))  # removing it would train it again
        ignored = ("report_to", "checkpoint_every", "keep_checkpoints") if done else ("report_to",)
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in ignored)
        if changed:
            moved = f"pass --device {old['device']} to continue it where it ran, " if "device" in changed else ""
            then = ("it finished: `credo compare --report-only` rebuilds the report from it as it is, or choose a new "
                    "--out" if done else "choose a new --out or remove that run directory")
            raise ConfigError(f"{run_dir} was made with a different config "
                              f"({', '.join(f'{k}: {old.get(k)!r} -> {new.get(k)!r}' for k in changed[:4])}); "
                              f"{moved}{then}")


def check_method_specs(specs: tuple[str, ...], where: str) -> None:
    """Every spec names a known method (`name` or `name:key=value`); else a one-line ConfigError naming it."""
    for spec in specs:
        try:
            method_registry.estimator_of(spec, where)
        except ConfigError:  # an unknown name: estimator_of's error already names `where`
            raise
        except ValueError as err:
            raise ConfigError(f"{where}: {err.args[0] if err.args else err}") from None


def resolve_preset(preset_name: str, methods: tuple[str, ...] | None, seeds: tuple[int, ...] | None,
                   token_budget: int | None, schedule: dict[str, Any] | None, task: str | None = None,
                   eval_split: str = "heldout", audit_n: int | None = None, premise_n: int | None = None,
                   lora: dict[str, Any] | None = None) -> Preset:
    """The preset with the caller's replacements, every method name and the task checked before any training.
    audit_n / premise_n (None = the preset's) size the measurements after the trainings; `lora` (a LoraSettings
    as a dict, r > 0) puts every run on LoRA adapters alike."""
    if preset_name not in PRESETS:
        raise ConfigError(f"unknown preset {preset_name!r}; available: {', '.join(PRESETS)}")
    preset = PRESETS[preset_name]
    if eval_split == "validation":  # every run evaluates on the task's validation split and never trains on it
        preset = replace(preset, train={**preset.train, "eval_split": "validation"})
    if lora and lora.get("r"):  # one setting for every method: recorded in each run's config, so checked on reuse
        preset = replace(preset, train={**preset.train, "lora": dict(lora)})
    preset = replace(preset, methods=tuple(methods or preset.methods),
                     seeds=tuple(seeds if seeds is not None else preset.seeds),
                     schedule={**preset.schedule, **(schedule or {})}, task=task or preset.task,
                     audit_n=preset.audit_n if audit_n is None else audit_n,
                     premise_n=preset.premise_n if premise_n is None else premise_n)
    if token_budget is not None:
        if token_budget <= 0:
            raise ConfigError("token_budget (--budget) must be a positive number of generated "
                              f"tokens, got {token_budget}")
        preset = replace(preset, token_budget=token_budget, eval_every_tokens=max(1, token_budget // 4))
    if not preset.seeds:
        raise ConfigError("seeds: give at least one seed")
    bad = [s for s in preset.seeds if not 0 <= s < SEED_LIMIT]
    if bad:
        raise ConfigError(f"seeds: each must be in 0..{SEED_LIMIT - 1}, got {bad[0]}")
    if len(set(preset.seeds)) < len(preset.seeds):
        raise ConfigError(f"seeds: {','.join(map(str, preset.seeds))} names a seed twice (two runs would "
                          "share one directory)")
    check_method_specs(preset.methods, where="methods")  # unknown names fail before any training
    folders = [run_dir_name(m, 0) for m in preset.methods]
    twice = sorted({m for m, f in zip(preset.methods, folders) if folders.count(f) > 1})
    if twice:
        raise ConfigError(f"methods: {', '.join(twice)} would share one run directory (a method named twice)")
    if "grpo" not in preset.methods:
        preset = replace(preset, methods=("grpo",) + preset.methods)  # the yardstick is always run
    try:
        make_task(preset.task)
    except (ValueError, KeyError) as err:
        raise ConfigError(f"preset {preset_name!r}: task {preset.task!r} is not available here ({err})") from None
    return preset
