import json
import os
import shutil

import pytest

from credo.core.outputs import run_kind
from credo.lab.compare.run import compare
from credo.lab.compare.goals import BEST, CONTROLS, SC, SRPO


def test_compare_smoke_writes_results_report_and_plots(saved_policy, tmp_path):
    out = str(tmp_path / "cmp")
    results = compare("smoke", out, methods=("rredcot",), start=saved_policy,
                      progress=False)
    on_disk = json.load(open(os.path.join(out, "results.json")))
    assert set(on_disk["methods"]) == {"grpo", "rredcot"}
    for name, entry in on_disk["methods"].items():
        run = entry["seeds"]["0"]
        assert {"curve", "final_accuracy", "tokens_generated", "seconds_per_step", "tokens_to_grpo_end"} <= set(run)
        # the smoke budget (1,500 generated tokens) is what ends each run: it trains until it has spent it
        assert run["tokens_generated"] >= 1500 and run["steps"] >= 1
        assert run["curve"][-1]["final"] and run["curve"][-1]["tokens_generated"] == run["tokens_generated"]
        assert all({"tokens_generated", "seconds", "accuracy"} <= set(p) for p in run["curve"])
        assert 0 <= entry["final_mean"] <= 1
    assert on_disk["methods"]["grpo"]["step_time_ratio"] == 1.0
    assert "audit" in on_disk and "rredcot" in on_disk["audit"]["methods"]
    # the protocol as trained, read back from the runs' configs; the estimate made before training
    protocol = on_disk["protocol"]
    assert protocol["task"] == "arith" and protocol["final_eval_n"] == 8 and protocol["seeds"] == [0]
    for name in ("grpo", "rredcot"):
        config = open(os.path.join(out, "runs", f"{name}-s0", "config.yaml")).read()
        schedule = protocol["methods"][name]
        assert f"epochs: {schedule['epochs']}" in config and f"minibatches: {schedule['minibatches']}" in config
    assert set(on_disk["estimate"]["per_method"]) == {"grpo", "rredcot"} and on_disk["estimate"]["seconds"] > 0
    assert json.load(open(os.path.join(out, "estimate.json"))) == on_disk["estimate"]  # --status reads it
    assert not [d for d in os.listdir(out) if "timing" in d]  # the timing runs were not written here
    assert (on_disk["equal_updates"]["updates"]
            and "## At equal policy updates" in open(os.path.join(out, "report.md")).read())
    report = open(os.path.join(out, "report.md")).read()
    assert "| grpo |" in report and "| rredcot † |" in report  # rredcot reads the reference solution: marked
    assert "† privileged: reads the task's reference solution" in report
    assert on_disk["methods"]["rredcot"]["privileged"] and not on_disk["methods"]["grpo"]["privileged"]
    for name in ("curves.png", "curves_by_update.png", "audit.png"):
        assert os.path.getsize(os.path.join(out, name)) > 1000
    assert results["failures"] == {}
    # the report rebuilds from what the comparison wrote, as it was; with one seed no goal is judged
    from credo.lab.compare.run import rewrite_report
    assert on_disk["goals"] and all(g["holds"] is None for g in on_disk["goals"])
    os.remove(os.path.join(out, "report.md"))
    rewrite_report(out)
    assert open(os.path.join(out, "report.md")).read() == report and "## Goals" in report


def test_a_failing_method_is_reported_and_the_rest_still_runs(saved_policy, tmp_path, monkeypatch):
    import credo.lab.compare.grid as cmp
    real = cmp.run_one

    def flaky(method, *args, **kwargs):
        if method == "rloo":
            raise RuntimeError("boom")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(cmp, "run_one", flaky)
    out = str(tmp_path / "cmp")
    results = compare("smoke", out, methods=("rloo",), start=saved_policy, progress=False)
    assert results["failures"] == {"rloo-s0": "RuntimeError: boom"}
    assert results["methods"]["grpo"]["final_mean"] is not None
    assert "rloo-s0 | failed: RuntimeError: boom" in open(os.path.join(out, "report.md")).read()
    assert os.path.isfile(os.path.join(out, "failure-rloo-s0.txt"))
    monkeypatch.setattr(cmp, "run_one", real)  # the cause fixed: the rerun trains it, and the failure is gone
    again = compare("smoke", out, methods=("rloo",), start=saved_policy, progress=False)
    assert again["failures"] == {} and "0" in again["methods"]["rloo"]["seeds"]
    assert not os.path.exists(os.path.join(out, "failure-rloo-s0.txt"))
    assert "failed" not in open(os.path.join(out, "report.md")).read()


@pytest.mark.slow
def test_parallel_jobs_give_the_same_runs_as_one_job(saved_policy, tmp_path):
    """--jobs 2 runs each training in a one-thread worker; with one thread here too, every curve must match."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serial = compare("smoke", str(tmp_path / "serial"), methods=("rloo",), seeds=(0, 1), start=saved_policy,
                         progress=False)
    finally:
        torch.set_num_threads(threads)
    parallel = compare("smoke", str(tmp_path / "parallel"), methods=("rloo",), seeds=(0, 1), start=saved_policy,
                       progress=False, jobs=2)
    assert parallel["failures"] == {} and serial["failures"] == {}
    for method in ("grpo", "rloo"):
        assert set(parallel["methods"][method]["seeds"]) == {"0", "1"}
        for seed in ("0", "1"):
            a, b = serial["methods"][method]["seeds"][seed], parallel["methods"][method]["seeds"][seed]
            assert [p["accuracy"] for p in a["curve"]] == [p["accuracy"] for p in b["curve"]]
            assert a["tokens_generated"] == b["tokens_generated"] and a["steps"] == b["steps"]
    # the two seeds are different runs, not one run reported twice
    runs = parallel["methods"]["grpo"]["seeds"]
    assert runs["0"]["tokens_generated"] != runs["1"]["tokens_generated"] or runs["0"]["curve"] != runs["1"]["curve"]


def _synthetic(finals: dict[str, list[float]], reach_at: dict[str, list[int | None]]) -> dict:
    """A results dict with one 100k-token curve point per seed (at the token count given, or below target), then
    its last curve point scoring its final accuracy (the curve's problems scoring as the final set's)."""
    methods = {}
    for name, values in finals.items():
        seeds = {}
        for i, final in enumerate(values):
            at = reach_at[name][i]
            curve = [{"step": 0, "tokens_generated": 0, "seconds": 0, "accuracy": 0.3}]
            curve.append({"step": 10, "tokens_generated": at or 100_000, "seconds": 1,
                          "accuracy": 0.99 if at else 0.0})
            curve.append({"step": 20, "tokens_generated": 200_000, "seconds": 2, "accuracy": final})
            curve.append({"step": 20, "tokens_generated": 200_000, "seconds": 2, "accuracy": final, "final": True})
            seeds[str(i)] = {"curve": curve, "final_accuracy": final, "seconds_per_step": 0.1, "steps": 20,
                             "tokens_generated": 200_000}
        methods[name] = {"seeds": seeds}
    return {"methods": methods, "token_budget": 200_000, "failures": {}}


def test_goal_checks_follow_their_rules():
    from credo.lab.compare.report import goals, summarise
    results = _synthetic(
        {"grpo": [0.40, 0.42, 0.44], "sc_grpo": [0.43, 0.46, 0.47], "rrpo": [0.41, 0.43, 0.45],
         "srpo:localiser=prompt": [0.50, 0.52, 0.51], "shuffled:of=sc_grpo:level=token": [0.40, 0.42, 0.44]},
        {"grpo": [100_000, 100_000, 100_000], "sc_grpo": [None, None, None], "rrpo": [None, 150_000, None],
         "srpo:localiser=prompt": [20_000, 20_000, 20_000], "shuffled:of=sc_grpo:level=token": [None] * 3})
    summarise(results)
    checks = {g["goal"]: g["holds"] for g in goals(results)}
    assert checks[SC] is True          # +3.3 points, paired sd 0.6: interval [+1.9, +4.8], over GRPO and its control
    # 20k tokens vs rrpo 250k/150k/250k (never: 200k + one 50k interval) and grpo 100k: p 0.027 and 0.021, Holm
    # over the two 0.042 (at 40k, p 0.034 and 0.036 each held alone, not together: Holm 0.068)
    assert checks[SRPO] is True
    # srpo, the best of 3 credit methods: +8.7 points, its interval at 1 - 0.05/3 above 0; at 0.1x GRPO's 200k tokens
    assert checks[BEST] is True
    results["methods"]["sc_grpo"]["seeds"]["1"]["final_accuracy"] = 0.30  # one bad seed: spread swamps the mean
    summarise(results)
    assert {g["goal"]: g["holds"] for g in goals(results)}[SC] is False
    one_seed = _synthetic({"grpo": [0.40], "sc_grpo": [0.60]}, {"grpo": [100_000], "sc_grpo": [10_000]})
    summarise(one_seed)
    assert all(g["holds"] is None for g in goals(one_seed))   # nothing judged on one seed


def test_a_goal_holds_only_where_its_interval_excludes_zero():
    """sc_grpo - grpo = +5, +1, +3 points: the mean (+3) exceeds the sd (2), which the old rule took as
    enough, but the 95% t interval (+3 ± 4.97) includes 0, so the goal does not hold."""
    from credo.lab.compare.report import goals, summarise
    results = _synthetic({"grpo": [0.40, 0.40, 0.40], "sc_grpo": [0.45, 0.41, 0.43]},
                         {"grpo": [None] * 3, "sc_grpo": [None] * 3})
    summarise(results)
    delta = results["methods"]["sc_grpo"]["delta_vs_grpo"]
    assert delta["ci"][0] < 0 < delta["mean"] - delta["sd"]
    assert {g["goal"]: g["holds"] for g in goals(results)}[SC] is False
    # SRPO sooner than RRPO on every seed but not sooner than GRPO: the two-part goal fails
    srpo = "srpo:localiser=prompt"
    results = _synthetic({"grpo": [0.40, 0.42, 0.44], "rrpo": [0.41, 0.43, 0.45], srpo: [0.40, 0.42, 0.44]},
                         {"grpo": [50_000, 60_000, 70_000], "rrpo": [None] * 3, srpo: [90_000, 100_000, 120_000]})
    summarise(results)
    assert {g["goal"]: g["holds"] for g in goals(results)}[SRPO] is False


def test_two_seeds_that_agree_to_the_problem_do_not_make_a_zero_width_interval():
    """Both seeds +1 problem in 300: the sample sd is 0, and an interval of zero width would exclude 0 and
    decide a goal. The sd is floored at one problem (1/300): t(0.975, 1) = 12.706 -> half-width 0.0299489."""
    from credo.lab.compare.stats import paired
    plain = paired([1 / 300, 1 / 300])
    assert plain["sd"] == 0 and plain["ci"][0] > 0  # what the floor is for
    floored = paired([1 / 300, 1 / 300], resolution=1 / 300)
    assert floored["sd_floored"] and abs(floored["ci"][0] - (1 / 300 - 0.0299489)) < 1e-6 and floored["ci"][0] < 0
    spread = paired([0.03, 0.05], resolution=1 / 300)  # a real spread above one problem is left alone
    assert "sd_floored" not in spread and abs(spread["sd"] - 0.0141421) < 1e-6


def test_paired_interval_and_seeds_needed_match_hand_computed_values():
    from credo.lab.compare.stats import detectable, paired, seeds_needed
    p = paired([0.03, 0.05, 0.01, 0.04])
    # mean 0.0325; sd sqrt(8.75e-4 / 3) = 0.0170783; t(0.975, 3) = 3.182446 -> half-width 0.0271752
    assert p["n"] == 4 and abs(p["mean"] - 0.0325) < 1e-12 and abs(p["sd"] - 0.0170783) < 1e-6
    assert abs(p["ci"][0] - 0.0053248) < 1e-6 and abs(p["ci"][1] - 0.0596752) < 1e-6
    # 80% power: n = 4: (3.182446 + 0.978472) * 0.0170783 / 2 = 0.035531 >= 0.0325;
    # n = 5: (2.776445 + 0.940965) * 0.0170783 / sqrt(5) = 0.028392 < 0.0325
    assert p["seeds_needed"] == 5
    assert paired([0.02, 0.02])["ci"] == [0.02, 0.02] and paired([0.02, 0.02])["seeds_needed"] == 2
    one = paired([0.1])
    assert one["ci"] is None and one["seeds_needed"] is None and one["mean"] == 0.1
    assert seeds_needed(0.0, 0.01) is None and seeds_needed(0.001, 1.0) is None  # never resolved (cap 1000)
    n = seeds_needed(0.01, 0.05)  # the smallest n: resolved at n, not at n - 1 (about twice the 50%-power count)
    assert detectable(0.05, n) < 0.01 <= detectable(0.05, n - 1) and 190 < n < 210


def _curve_run(points: list[tuple[int, float]], final: float) -> dict:
    curve = [{"step": s, "tokens_generated": 1000 * s, "seconds": s, "accuracy": a} for s, a in points]
    curve.append({"step": points[-1][0], "tokens_generated": 1000 * points[-1][0], "seconds": 1, "accuracy": final,
                  "final": True})
    return {"curve": curve, "final_accuracy": final, "seconds_per_step": 0.1, "steps": points[-1][0],
            "tokens_generated": 1000 * points[-1][0]}


def test_equal_updates_table_interpolates_on_the_curve_set_and_pairs_by_seed():
    from credo.lab.compare.report import report, summarise
    from credo.lab.compare.stats import accuracy_at_step
    grpo = {"0": _curve_run([(0, 0.30), (10, 0.40), (20, 0.50)], 0.9),
            "1": _curve_run([(0, 0.30), (10, 0.44), (21, 0.52)], 0.9)}
    vine = {"0": _curve_run([(0, 0.30), (4, 0.50)], 0.1), "1": _curve_run([(0, 0.30), (4, 0.52)], 0.1)}
    results = {"methods": {"grpo": {"seeds": grpo}, "vineppo": {"seeds": vine}}, "token_budget": 30_000,
               "failures": {}, "preset": "t", "start": "s", "commit": "c", "date": "d", "machine": "m"}
    assert accuracy_at_step(grpo["0"]["curve"], 20) == 0.50  # the final point (0.9, other problems) is left out
    assert accuracy_at_step(vine["0"]["curve"], 5) is None   # stopped at 4 updates
    summarise(results)
    table = results["equal_updates"]
    assert table["updates"] == [4, 20]  # fewest updates of any run; fewest of GRPO's
    at4 = table["methods"]["vineppo"]["4"]
    # grpo at 4 updates: 0.30 + 0.10 * 0.4 = 0.34 and 0.30 + 0.14 * 0.4 = 0.356; deltas 0.16, 0.164
    assert abs(table["methods"]["grpo"]["4"]["accuracy_mean"] - 0.348) < 1e-12
    assert abs(at4["delta_vs_grpo"]["mean"] - 0.162) < 1e-12
    # sd 0.0028284, t(0.975, 1) = 12.7062: half-width 0.025412
    assert abs(at4["delta_vs_grpo"]["ci"][0] - 0.136588) < 1e-5
    assert table["methods"]["vineppo"]["20"]["accuracy_mean"] is None
    # one run stopping before 20 updates takes the method out there, rather than averaging the seeds that got there
    vine["1"] = _curve_run([(0, 0.30), (4, 0.52), (25, 0.60)], 0.1)
    summarise(results)
    assert results["equal_updates"]["methods"]["vineppo"]["20"] == {"accuracy_mean": None, "seeds": 1,
                                                                     "delta_vs_grpo": None}
    vine["1"] = _curve_run([(0, 0.30), (4, 0.52)], 0.1)
    summarise(results)
    text = report(results)
    at4 = results["equal_updates"]["methods"]["vineppo"]["4"]["delta_vs_grpo"]
    assert at4["family"] == "every method vs GRPO at 4 updates" and at4["family_size"] == 1
    assert "## At equal policy updates" in text and (
        f"| vineppo | 0.510 | +16.2 [+13.7, +18.7] (Holm p {at4['p_holm']:.3f} among 1; simultaneous [+13.7, +18.7]) "
        "| — | — |") in text


def test_each_control_is_paired_with_its_method_and_judged():
    from credo.lab.compare.report import goals, report, summarise
    results = _synthetic({"grpo": [0.40, 0.42, 0.44], "rredcot": [0.45, 0.47, 0.50],
                          "shuffled:of=rredcot": [0.40, 0.41, 0.45], "sc_grpo": [0.41, 0.43, 0.45],
                          "shuffled:of=sc_grpo": [0.42, 0.42, 0.46], "shuffled:of=vineppo": [0.40, 0.40, 0.40]},
                         {k: [None] * 3 for k in ("grpo", "rredcot", "shuffled:of=rredcot", "sc_grpo",
                                                  "shuffled:of=sc_grpo", "shuffled:of=vineppo")})
    results.update(preset="t", start="s", commit="c", date="d", machine="m")
    summarise(results)
    pairs = {p["control"]: p for p in results["controls"]}
    assert set(pairs) == {"shuffled:of=rredcot", "shuffled:of=sc_grpo", "shuffled:of=vineppo"}
    assert pairs["shuffled:of=rredcot"]["method"] == "rredcot"
    rred = pairs["shuffled:of=rredcot"]["delta"]
    assert rred["n"] == 3 and abs(rred["mean"] - 0.0533333) < 1e-6 and rred["ci"][0] > 0  # +5, +6, +5 points
    assert pairs["shuffled:of=sc_grpo"]["delta"]["ci"][0] < 0
    assert pairs["shuffled:of=vineppo"]["delta"] is None  # its method is not in the grid
    check = {g["goal"]: g for g in goals(results)}[CONTROLS]
    # sc_grpo is not above its control; shuffled:of=vineppo has no method to be above, and is named, not judged
    assert (check["holds"] is False
            and "(controls without their method, left out: shuffled:of=vineppo)" in check["evidence"])
    text = report(results)
    assert rred["family_size"] == 2 and rred["p_holm"] == min(1.0, 2 * rred["p"])  # vineppo's has no interval
    low, high = rred["ci_simultaneous"]
    assert (f"| rredcot | shuffled:of=rredcot | +5.3 [+3.9, +6.8] | Holm p {rred['p_holm']:.3f}; "
            f"[{100 * low:+.1f}, {100 * high:+.1f}] | 3 |") in text
    assert "| vineppo | shuffled:of=vineppo | method not in this comparison | — | — |" in text
    # the controls are no credit methods of their own: the best credit method is rredcot
    assert "best of 2 credit methods by Δ vs GRPO: rredcot" in {g["goal"]: g for g in goals(results)}[BEST]["evidence"]
    del results["methods"]["shuffled:of=vineppo"], results["methods"]["shuffled:of=sc_grpo"]
    summarise(results)
    assert {g["goal"]: g["holds"] for g in goals(results)}[CONTROLS] is True


def test_every_method_shares_one_schedule_unless_its_recipe_sets_its_own(monkeypatch, saved_policy):
    from dataclasses import replace
    from credo.train import methods
    from credo.lab.compare.presets import PRESETS, protocol, run_config
    from credo.lab.compare.report import report
    monkeypatch.setitem(methods.RECIPES, "paper_x", methods.Recipe("grpo", "a paper's own schedule", {"epochs": 3}))
    preset = replace(PRESETS["smoke"], methods=("grpo", "rredcot", "paper_x"), schedule={"epochs": 1, "minibatches": 4})
    for spec in ("grpo", "rredcot"):
        config = run_config(spec, 0, preset, saved_policy)
        assert (config.epochs, config.minibatches) == (1, 4)
    assert run_config("paper_x", 0, preset, saved_policy).epochs == 3
    recorded = protocol(preset, saved_policy, jobs=1)
    assert recorded["schedule"]["epochs"] == 1 and recorded["schedule"]["minibatches"] == 4
    assert recorded["methods"]["grpo"]["source"] == "shared" and recorded["methods"]["rredcot"]["source"] == "shared"
    assert recorded["methods"]["paper_x"] == {"epochs": 3, "minibatches": 4, "lr": recorded["schedule"]["lr"],
                                              "grad_clip": 1.0, "source": "recipe"}
    text = report({**_synthetic({"grpo": [0.4]}, {"grpo": [None]}), "protocol": recorded, "preset": "t", "start": "s",
                   "commit": "c", "date": "d", "machine": "m"})
    assert "every method 1 epoch(s) × 4 mini-batch(es)" in text and "| paper_x | 3 × 4 |" in text


def test_a_shared_gradient_clip_reaches_every_method_and_the_report(saved_policy):
    from dataclasses import replace
    from credo.lab.compare.presets import PRESETS, protocol, run_config
    from credo.lab.compare.config import CompareConfig
    from credo.lab.compare.report import report
    from credo.core.config import ConfigError, load_config
    config = load_config(CompareConfig, None, ["grad_clip=0.5"], prefix="compare.")
    assert config.schedule == {"grad_clip": 0.5}
    preset = replace(PRESETS["smoke"], methods=("grpo", "ibpo", "dapo"), schedule=config.schedule)
    assert {run_config(m, 0, preset, saved_policy).grad_clip for m in preset.methods} == {0.5}
    recorded = protocol(preset, saved_policy, jobs=1)
    text = report({**_synthetic({"grpo": [0.4]}, {"grpo": [None]}), "protocol": recorded, "preset": "t", "start": "s",
                   "commit": "c", "date": "d", "machine": "m"})
    assert "gradient-norm clip 0.5 (one schedule for all)" in text
    for bad in ("0", "-1", "2e6"):
        try:
            load_config(CompareConfig, None, [f"grad_clip={bad}"], prefix="compare.")
        except ConfigError as err:
            assert "compare.grad_clip" in str(err)
        else:
            raise AssertionError(f"grad_clip={bad} was accepted")


def test_a_method_spec_becomes_credit_options_and_the_task_comes_from_the_preset(saved_policy):
    from dataclasses import replace
    from credo.lab.compare.presets import PRESETS, run_config, run_dir_name
    from credo.core.config import to_dict
    from credo.credit.rredcot import RREDCoTConfig
    config = run_config("rredcot:lam=0.25", 0, replace(PRESETS["smoke"], task="arith-long"), saved_policy)
    # the credit options are stored as data: the estimator's every option, checked, defaults filled in
    assert (config.method == "rredcot" and config.credit == to_dict(RREDCoTConfig(lam=0.25))
            and config.task == "arith-long")
    assert run_dir_name("shuffled:of=rredcot", 2) == "shuffled_of=rredcot-s2"


def test_presets_follow_the_protocol():
    from credo.lab.compare.presets import PRESETS
    from credo.lab.compare.stats import control_target
    long = PRESETS["long"]
    assert long.task == "arith-long" and len(long.seeds) >= 5 and long.jobs == 2 and not long.note
    # the budget is the measured one (docs/results/arith-long-grpo/wide), evaluated at least 6 times
    assert long.token_budget == 1_000_000 and long.token_budget // long.eval_every_tokens >= 6
    assert long.methods == ("grpo", "dr_grpo", "dapo", "gspo", "rredcot", "shuffled:of=rredcot", "vineppo", "rrpo",
                            "srpo", "ibpo:preserve_mass=true", "sc_grpo", "shuffled:of=sc_grpo")
    beyond = PRESETS["beyond"]  # the long protocol, so its grpo and rredcot rows are the long grid's runs
    assert all(getattr(beyond, f) == getattr(long, f) for f in ("task", "seeds", "token_budget", "eval_every_tokens",
                                                               "eval_n", "final_eval_n", "train", "schedule"))
    assert {"tempo", "lambda_grpo", "entropy_mask", "gtpo:form=weights", "otb", "prefix_shaping"} < set(beyond.methods)
    assert control_target("shuffled:of=tempo:options.of=rredcot:include_reference=false") in beyond.methods
    for name in ("quick", "full", "long", "beyond"):
        assert PRESETS[name].final_eval_n >= 1000
        for spec in PRESETS[name].methods:  # every control's method is in the same grid
            assert control_target(spec) in (None, *PRESETS[name].methods)


def test_every_method_of_every_preset_makes_its_run_config():
    """Each spec of each grid is a run its config loader accepts (a reset recipe's localiser option goes to its
    reset, not to its credit options: srpo:localiser=prompt in long-skilled)."""
    from credo.lab.compare.presets import PRESETS, run_config
    for name, preset in PRESETS.items():
        for spec in preset.methods:
            config = run_config(spec, 0, preset, "start")
            composed = spec.split(":")[0] in ("dapo", "gspo") and ":of=" in spec  # dapo:of=rredcot is its own name
            assert config.method == (spec if composed else spec.split(":")[0]), (name, spec)
    skilled = PRESETS["long-skilled"]
    assert run_config("srpo:localiser=prompt", 0, skilled, "start").reset.localiser == "prompt"
    assert run_config("srpo:localiser=value", 0, skilled, "start").reset.localiser == "value"
    assert run_config("rredcot:include_reference=false", 0, skilled, "start").credit["include_reference"] is False
    # checkpoints every 50 steps, unless the preset's training settings say otherwise (SmolLM2's slow steps)
    assert run_config("grpo", 0, skilled, "start").checkpoint_every == 50
    assert run_config("grpo", 0, PRESETS["smollm2-long"], "start").checkpoint_every == 10
    # room for every worked solution of its 5-8 term chains (83 tokens at most), as its start was evaluated
    assert run_config("grpo", 0, PRESETS["smollm2-long"], "start").sampling.max_new_tokens == 96


def test_a_finished_run_is_reused_whatever_its_checkpoint_interval_but_a_part_way_one_is_not(tmp_path, saved_policy):
    """How often a finished run checkpointed does not change its result: a preset that now checkpoints more often
    reuses it; a part-way run resumes from the checkpoints it made, so there the change is refused in one line."""
    from dataclasses import replace
    from credo.core.config import ConfigError, dump_yaml
    from credo.lab.compare.presets import PRESETS, check_reusable, run_config
    before = replace(PRESETS["smoke"], train={**PRESETS["smoke"].train, "checkpoint_every": 50})
    now = replace(before, train={**before.train, "checkpoint_every": 10})
    run = tmp_path / "runs" / "grpo-s0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_yaml(run_config("grpo", 0, before, saved_policy)))
    plan = [("grpo", 0, str(run))]
    with pytest.raises(ConfigError, match=r"grpo-s0 was made with a different config \(checkpoint_every: 50 -> 10\)"):
        check_reusable(plan, now, saved_policy)
    (run / "summary.json").write_text("{}")
    check_reusable(plan, now, saved_policy)
    with pytest.raises(ConfigError, match=r"lr: "):  # a finished run's training settings still count
        check_reusable(plan, replace(now, schedule={**now.schedule, "lr": 1e-3}), saved_policy)


def test_an_unavailable_task_is_one_line_before_any_training(monkeypatch, tmp_path, saved_policy):
    import pytest
    from dataclasses import replace
    from credo.lab.compare.presets import PRESETS
    from credo.core.config import ConfigError
    monkeypatch.setitem(PRESETS, "nowhere", replace(PRESETS["smoke"], task="no-such-task"))
    with pytest.raises(ConfigError, match="task 'no-such-task' is not available"):
        compare("nowhere", str(tmp_path / "cmp"), start=saved_policy, progress=False)
    assert not os.path.exists(tmp_path / "cmp")


def test_the_estimate_adds_steps_and_evaluations_and_divides_by_jobs():
    from credo.lab.compare.eta import Timing, estimate
    timings = {"grpo": Timing(2.0, 1000), "vineppo": Timing(30.0, 5000)}
    # grpo: 10 steps x 2 s + (10000 // 2500 + 1) evaluations x 1 s + final (2x a curve evaluation) = 27 s
    # vineppo: 2 steps x 30 s + 5 + 2 = 67 s; half done (5000 left): 1 x 30 + (5000 // 2500 + 1) + 2 = 35 s
    out = estimate([("grpo", 10_000), ("vineppo", 10_000), ("vineppo", 5_000), ("grpo", 0)], timings, 1.0,
                   eval_every_tokens=2500, final_eval_ratio=2.0, jobs=2)
    assert out["per_method"]["grpo"]["run_seconds"] == 27.0 and out["per_method"]["vineppo"]["run_seconds"] == 102.0
    assert out["seconds"] == (27 + 102) / 2 and out["runs"] == 4 and out["untimed"] == []
    # a method whose timing step failed is left out and named
    out = estimate([("grpo", 10_000), ("ibpo", 10_000)], {"grpo": timings["grpo"]}, 1.0, eval_every_tokens=2500,
                   final_eval_ratio=2.0, jobs=1)
    assert out["seconds"] == 27 and out["untimed"] == ["ibpo"]


def test_a_resumed_comparison_costs_a_method_from_its_finished_runs_not_from_a_timed_step(monkeypatch,
                                                                                          tmp_path, saved_policy):
    """grpo-s0 finished (10 steps, 20 s of its own clock, 1500 tokens): grpo's remaining run is costed at 2 s and
    150 tokens a step and grpo is not timed again; rredcot, with no finished run, is."""
    import json
    import credo.lab.compare.eta as eta
    from credo.lab.compare.eta import estimate_wall_time
    from credo.lab.compare.presets import resolve_preset
    preset = resolve_preset("smoke", ("grpo", "rredcot"), (0, 1), None, None)
    plan = [(m, s, str(tmp_path / "runs" / f"{m}-s{s}")) for s in (0, 1) for m in ("grpo", "rredcot")]
    done = tmp_path / "runs" / "grpo-s0"
    done.mkdir(parents=True)
    (done / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "tokens_generated": 150 * i,
                                                            "seconds": 2.0 * i}) + "\n"
                                                for i in range(1, 11)))
    (done / "summary.json").write_text(json.dumps({"step": 10, "tokens_generated": 1500, "seconds": 20.0,
                                                   "final_accuracy": 0.5}))
    timed = []
    monkeypatch.setattr(eta, "time_methods", lambda specs, *a, **k: (timed.extend(specs) or
                                                                     {s: eta.Timing(9.0, 300) for s, _ in specs}, 1.0))
    out = estimate_wall_time(plan, preset, saved_policy, jobs=1)
    assert timed == [("rredcot", 0)]
    assert (out["per_method"]["grpo"]["from"] == "finished runs"
            and out["per_method"]["rredcot"]["from"] == "one timed step")
    assert (out["per_method"]["grpo"]["seconds_per_step"], out["per_method"]["grpo"]["tokens_per_step"]) == (2.0, 150)
    # 1500 tokens at 150 a step = 10 steps x 2 s, plus its evaluations at the timed 1 s each
    evaluations = preset.token_budget // preset.eval_every_tokens + 1 + preset.final_eval_n / preset.eval_n
    assert out["per_method"]["grpo"]["run_seconds"] == round(20.0 + evaluations * 1.0, 1)
    # every remaining method costed from finished runs: no step is timed, only one evaluation
    from credo.lab.compare.presets import run_config
    assert eta.time_evaluation(run_config("grpo", 1, preset, saved_policy), threads=1) > 0  # the real one runs
    monkeypatch.setattr(eta, "time_evaluation", lambda config, threads=None: 3.0)
    timed.clear()
    out = estimate_wall_time([plan[0], plan[2]], preset, saved_policy, jobs=1)
    assert timed == [] and out["eval_seconds"] == 3.0 and out["runs"] == 1


def test_a_resumed_comparison_costs_a_method_from_its_part_way_runs_and_reuses_the_recorded_evaluation(
        monkeypatch, tmp_path, saved_policy):
    """rredcot-s0 is part-way (4 steps, 12 s of its own clock, 400 tokens) and grpo-s0 finished: neither is timed
    again; rredcot costs 3 s and 100 tokens a step, 'from part-way runs'. With an evaluation recorded by an earlier
    start for the same number of problems, none is timed either; for another number of problems it is."""
    import json
    import credo.lab.compare.eta as eta
    from credo.lab.compare.presets import resolve_preset
    preset = resolve_preset("smoke", ("grpo", "rredcot"), (0, 1), None, None)
    plan = [(m, s, str(tmp_path / "runs" / f"{m}-s{s}")) for s in (0, 1) for m in ("grpo", "rredcot")]
    for name, steps, finished in (("grpo-s0", 10, True), ("rredcot-s0", 4, False)):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        per = (150, 2.0) if finished else (100, 3.0)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "tokens_generated": per[0] * i,
                                                               "seconds": per[1] * i}) + "\n"
                                                   for i in range(1, steps + 1)))
        if finished:
            (run / "summary.json").write_text(json.dumps({"step": 10, "tokens_generated": 1500, "seconds": 20.0,
                                                          "final_accuracy": 0.5}))
    timed, evaluated = [], []
    monkeypatch.setattr(eta, "time_methods", lambda specs, *a, **k: (timed.extend(specs) or {}, 1.0))
    monkeypatch.setattr(eta, "time_evaluation", lambda config, threads=None: evaluated.append(1) or 5.0)
    out = eta.estimate_wall_time(plan, preset, saved_policy, jobs=1)
    assert timed == [] and evaluated == [1] and out["eval_seconds"] == 5.0 and out["eval_n"] == preset.eval_n
    rredcot = out["per_method"]["rredcot"]
    assert (rredcot["from"], rredcot["seconds_per_step"], rredcot["tokens_per_step"]) == ("part-way runs", 3.0, 100)
    assert out["per_method"]["grpo"]["from"] == "finished runs"
    eta.keep_estimate(str(tmp_path), out)
    assert eta.recorded_eval_seconds(str(tmp_path), preset.eval_n, 1) == 5.0
    assert eta.recorded_eval_seconds(str(tmp_path), preset.eval_n + 1, 1) == 0.0  # another evaluation: timed again
    assert eta.recorded_eval_seconds(str(tmp_path), preset.eval_n, 2) == 0.0  # other threads per job: too
    assert eta.recorded_eval_seconds(str(tmp_path / "elsewhere"), preset.eval_n, 1) == 0.0
    evaluated.clear()
    again = eta.estimate_wall_time(plan, preset, saved_policy, jobs=1, eval_seconds=5.0)
    assert evaluated == [] and again["seconds"] == out["seconds"]
    # a method that must be timed is timed without its evaluation when one is recorded
    given = []
    monkeypatch.setattr(eta, "time_methods", lambda specs, *a, **k: (given.append(k.get("eval_seconds")) or
                                                                     ({s: eta.Timing(1.0, 10) for s, _ in specs},
                                                                      k.get("eval_seconds") or 1.0)))
    (tmp_path / "runs" / "rredcot-s0" / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    damaged = eta.estimate_wall_time(plan, preset, saved_policy, jobs=1, eval_seconds=5.0)
    assert given == [5.0] and damaged["eval_seconds"] == 5.0 and damaged["per_method"]["rredcot"]["from"] == (
        "one timed step")  # a damaged log is not a clock: the method is timed, and the resume names the file
    (tmp_path / "estimate.json").write_text(json.dumps({**out, "eval_seconds": "x"}))
    from credo.core.config import UserError
    with pytest.raises(UserError, match=r"estimate\.json: eval_seconds"):
        eta.recorded_eval_seconds(str(tmp_path), preset.eval_n, 1)
    # the steps an earlier start timed (same jobs) are not timed again; with other jobs they are
    (tmp_path / "estimate.json").write_text(json.dumps(damaged))
    recorded = eta.recorded_steps(str(tmp_path), 1)
    assert recorded["rredcot"] == (eta.Timing(1.0, 10), "one timed step") and eta.recorded_steps(str(tmp_path), 2) == {}
    given.clear()
    monkeypatch.setattr(eta, "time_methods", lambda specs, *a, **k: (given.extend(specs) or {}, 1.0))
    resumed = eta.estimate_wall_time(plan, preset, saved_policy, jobs=1, eval_seconds=5.0, recorded=recorded)
    assert given == [] and resumed["per_method"]["rredcot"]["from"] == "one timed step"
    assert resumed["per_method"]["rredcot"]["seconds_per_step"] == 1.0


def test_over_an_hour_needs_yes_or_a_yes_at_the_terminal():
    import pytest
    from credo.lab.compare.eta import confirm
    from credo.core.config import ConfigError
    said, asked = [], []
    quiet = said.append

    def ask(answer):
        return lambda prompt: asked.append(prompt) or answer

    confirm(3599, yes=False, interactive=False, say=quiet)           # under an hour: no question
    confirm(7200, yes=True, interactive=False, say=quiet)            # --yes
    confirm(7200, yes=True, interactive=True, ask=ask("n"), say=quiet)
    assert asked == [] and said[0] == "credo compare: estimated wall time 60 min"
    confirm(90, yes=False, interactive=False, say=quiet)
    assert said[-1] == "credo compare: estimated wall time 90 s"
    with pytest.raises(ConfigError, match="over an hour: pass --yes"):
        confirm(7200, yes=False, interactive=False, say=quiet)     # a script: refused, one line
    confirm(7200, yes=False, interactive=True, ask=ask("y"), say=quiet)
    with pytest.raises(ConfigError, match="answered no"):
        confirm(7200, yes=False, interactive=True, ask=ask(""), say=quiet)
    assert len(asked) == 2 and "2.0 h" in asked[0]


def test_the_cli_refuses_a_long_comparison_without_yes_before_training(monkeypatch, tmp_path, saved_policy, capsys):
    """Timings injected (no training): 1000 s per step makes the smoke grid take hours."""
    import io
    import sys
    import credo.lab.compare.eta as eta
    from credo.cli.main import main
    monkeypatch.setattr(eta, "time_methods",
                        lambda specs, *a, **k: ({s: eta.Timing(1000.0, 100) for s, _ in specs}, 1.0))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal
    out = str(tmp_path / "cmp")
    assert main(["compare", "--preset", "smoke", "--start", saved_policy, "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "estimated wall time" in err and "pass --yes to start it" in err and "Traceback" not in err
    assert not os.path.exists(out)  # refused before anything was written


def test_a_resumed_comparisons_bar_starts_at_the_tokens_its_runs_already_hold(monkeypatch, tmp_path):
    """A finished run counts its whole budget and a part-way one the tokens of its newest checkpoint (where it
    resumes: its log's later steps are trained again) before anything trains, so the bar's rate and ETA measure
    only what this invocation trains (they jumped to thousands of tokens a second, then went backwards)."""
    import credo.lab.compare.grid as grid
    from credo.lab.compare.presets import resolve_preset
    preset = resolve_preset("smoke", ("grpo",), (0, 1, 2), None, None)
    budget, runs = preset.token_budget, tmp_path / "runs"
    plan = [("grpo", s, str(runs / f"grpo-s{s}")) for s in (0, 1, 2)]
    (runs / "grpo-s0").mkdir(parents=True)
    (runs / "grpo-s0" / "summary.json").write_text("{}")
    (runs / "grpo-s1").mkdir()
    (runs / "grpo-s1" / "metrics.jsonl").write_text(json.dumps({"step": 2, "tokens_generated": 300}) + "\n"
                                                    + json.dumps({"step": 3, "tokens_generated": 420}) + "\n")
    assert grid.tokens_done(str(runs / "grpo-s1"), budget) == 0  # no checkpoint: it starts again
    (runs / "grpo-s1" / "checkpoints" / "step-000002").mkdir(parents=True)
    assert grid.tokens_done(str(runs / "grpo-s1"), budget) == 300

    class Bar:
        def __init__(self, *args, initial=0, **kwargs):
            self.n, self.updates = initial, []
        def update(self, n):
            self.updates.append(n)
            self.n += n
        def set_description(self, text):
            pass
        def close(self):
            bars.append(self)
    bars = []
    def run_one(method, seed, preset, start, run_dir, on_step, report_to=()):
        if seed:  # the part-way run logs 450, the new one 150, then each finishes
            on_step(None, {"tokens_generated": 450 if seed == 1 else 150, "step": 3})
        return {}
    monkeypatch.setattr(grid, "tqdm", Bar)
    monkeypatch.setattr(grid, "run_one", run_one)
    grid.train_all(plan, preset, "", jobs=1, progress=False)
    bar = bars[0]
    assert bar.n - sum(bar.updates) == budget + 300  # where it started
    assert bar.updates == [0, 150, budget - 450, 150, budget - 150] and bar.n == 3 * budget
    # with workers: a resumed run's stale rows beyond its checkpoint count only once its trainer has cut the log
    log = runs / "grpo-s1" / "metrics.jsonl"
    parallel, since = Bar(initial=budget + 300), os.path.getmtime(log) + 1  # handed to a worker after the log
    shown = grid._show(parallel, budget + 300, plan, preset, [budget, 300, 0], {}, {1: since})
    assert shown == budget + 300 and parallel.updates == [0]  # 420 logged, not counted: no jump forward...
    log.write_text(json.dumps({"step": 2, "tokens_generated": 300}) + "\n")  # ...the trainer cuts it back...
    os.utime(log, (since + 1, since + 1))
    assert grid._show(parallel, shown, plan, preset, [budget, 300, 0], {}, {1: since}) == budget + 300
    with open(log, "a") as f:  # ...and from then on its steps count
        f.write(json.dumps({"step": 3, "tokens_generated": 440}) + "\n")
    os.utime(log, (since + 2, since + 2))
    assert grid._show(parallel, shown, plan, preset, [budget, 300, 0], {}, {1: since}) == budget + 440
    assert parallel.updates == [0, 0, 140]


def test_until_starts_the_runs_that_can_end_by_then_first_and_the_rest_in_plan_order(monkeypatch, tmp_path):
    """A machine lent for a fixed time: runs whose estimate fits before --until go first (in plan order, runs
    finished earlier before all); when none fits, plan order again; results come back in plan order whatever
    order the runs went in."""
    import time
    import credo.lab.compare.grid as grid
    from credo.lab.compare.config import CompareConfig
    from credo.lab.compare.eta import run_estimates
    from credo.lab.compare.presets import resolve_preset
    from credo.core.config import ConfigError
    noon = time.mktime((2026, 12, 31, 12, 0, 0, 0, 0, -1))
    assert grid.time_of_day("13:05", noon) == noon + 65 * 60
    assert grid.time_of_day("11:30", noon) == noon + 23.5 * 3600  # tomorrow's: the next year's first day
    assert grid.time_of_day("") is None
    for wrong in ("25:00", 785):  # 785: YAML's reading of an unquoted 13:05
        with pytest.raises(ConfigError, match="--until must be a time of day HH:MM"):
            CompareConfig(until=wrong)
    with pytest.raises(ConfigError, match="--until must be a time of day HH:MM"):
        grid.time_of_day("7pm")  # the library's compare() refuses it before any timing
    from credo.lab.compare.run import without_until
    assert without_until("credo compare --out 'a b' --until 13:00 --yes") == "credo compare --out 'a b' --yes"
    assert without_until("credo compare --until=13:00 --yes") == "credo compare --yes"
    now = time.time()
    assert grid.next_run([0, 1, 2], [5000.0, None, 200.0], now + 300) == 2  # the first that fits
    assert grid.next_run([0, 1], [5000.0, None], now + 300) == 0  # none fits: plan order
    assert grid.next_run([1, 2], [5000.0, 10.0, 20.0], None) == 1  # no --until: plan order
    preset = resolve_preset("smoke", ("grpo",), (0, 1, 2), None, None)
    plan = [("grpo", s, str(tmp_path / "runs" / f"grpo-s{s}")) for s in (0, 1, 2)]
    (tmp_path / "runs" / "grpo-s2").mkdir(parents=True)
    (tmp_path / "runs" / "grpo-s2" / "summary.json").write_text("{}")
    estimate = {"per_method": {"grpo": {"seconds_per_step": 2.0, "tokens_per_step": 150}}, "eval_seconds": 1.0}
    seconds = run_estimates(plan, preset, estimate)
    assert seconds[2] == 0.0 and seconds[0] == seconds[1] > 2.0 * preset.token_budget / 150
    assert run_estimates(plan, preset, {"per_method": {}})[:2] == [None, None]
    from dataclasses import replace
    checked = replace(preset, premise_n=8, methods=("grpo", "sc_grpo"))  # sc_grpo's teacher check follows it
    sc_plan = [("sc_grpo", 0, str(tmp_path / "runs" / "sc_grpo-s0")), plan[2]]
    costs = {**estimate, "per_method": {"sc_grpo": estimate["per_method"]["grpo"]}}
    with_checks = run_estimates(sc_plan, checked, costs)
    assert with_checks == [seconds[0] + 8 * 1.0 / preset.eval_n, 0.0]
    order = []
    monkeypatch.setattr(grid, "run_one", lambda m, seed, *a, **k: order.append(seed) or {"seed": seed})
    outcomes = grid.train_all(plan, preset, "", jobs=1, progress=False, seconds=[5000.0, 100.0, 0.0],
                              until=time.time() + 300)
    assert order == [2, 1, 0] and [result["seed"] for result, _ in outcomes] == [0, 1, 2]  # the finished one first
    order.clear()  # without --until too: a finished run is read back before any run trains
    grid.train_all(plan, preset, "", jobs=1, progress=False)
    assert order == [2, 0, 1] and grid.finished_first(plan) == [2, 0, 1]


def test_report_only_rebuilds_a_committed_comparison(tmp_path):
    """compare-long (the 520k-token check) predates the recorded protocol: its report still rebuilds."""
    import shutil
    from credo.lab.compare.run import rewrite_report
    source = os.path.join(os.path.dirname(__file__), "..", "docs", "results", "compare-long", "results.json")
    os.makedirs(tmp_path / "full")
    shutil.copy(source, tmp_path / "full" / "results.json")
    results = rewrite_report(str(tmp_path / "full"))
    text = open(tmp_path / "full" / "report.md").read()
    assert "not recorded" in text and "## At equal policy updates" in text
    sc = results["methods"]["sc_grpo"]["delta_vs_grpo"]
    assert sc["n"] == 3 and sc["ci"][0] < sc["mean"] < sc["ci"][1]
    assert results["equal_updates"]["updates"][0] == min(r["steps"] for e in results["methods"].values()
                                                         for r in e["seeds"].values())


@pytest.mark.slow
def test_a_run_directory_from_another_budget_is_refused_not_mixed_in(saved_policy, tmp_path):
    import pytest
    out = str(tmp_path / "cmp")
    first = compare("smoke", out, methods=("grpo",), start=saved_policy, progress=False)
    again = compare("smoke", out, methods=("grpo",), start=saved_policy, progress=False)  # same config: reused
    assert again["methods"]["grpo"]["seeds"]["0"]["curve"] == first["methods"]["grpo"]["seeds"]["0"]["curve"]
    with pytest.raises(ValueError, match=r"grpo-s0 .*max_generated_tokens: 1500 -> 3000"):
        compare("smoke", out, methods=("grpo",), start=saved_policy, progress=False, token_budget=3000)


def test_an_exported_comparison_holds_only_finished_runs_records_and_resumes_without_training(
        saved_policy, tmp_path, monkeypatch, capsys):
    """`--export` copies what the README says moves a comparison to another machine (each finished run's config,
    metrics and summary; no weights, checkpoints or locks) and its report; a part-way run is left out and
    named. The export is a comparison of its own kind that resumes by reusing each run, training nothing."""
    import shutil
    from credo.cli.main import main
    from credo.train.trainer import Trainer
    first = compare("smoke", str(tmp_path / "a"), methods=("grpo",), start=saved_policy, progress=False)
    part_way = tmp_path / "a" / "runs" / "rredcot-s0"
    part_way.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(tmp_path / "a" / "runs" / "grpo-s0" / name, part_way / name)
    dest = tmp_path / "b"
    assert main(["compare", "--out", str(tmp_path / "a"), "--export", str(dest)]) == 0
    said = capsys.readouterr().out
    assert "exported 1 finished run(s)" in said and "left out 1 part-way (rredcot-s0)" in said
    assert sorted(os.listdir(dest / "runs")) == ["grpo-s0"]
    assert sorted(os.listdir(dest / "runs" / "grpo-s0")) == [".credo-kind", "config.yaml",
                                                             "metrics.jsonl.xz", "summary.json"]
    import lzma  # the log is stored compressed, its content unchanged
    assert (lzma.decompress((dest / "runs" / "grpo-s0" / "metrics.jsonl.xz").read_bytes())
            == (tmp_path / "a" / "runs" / "grpo-s0" / "metrics.jsonl").read_bytes())
    assert (dest / "report.md").read_text() == (tmp_path / "a" / "report.md").read_text()
    assert (dest / "estimate.json").read_text() == (tmp_path / "a" / "estimate.json").read_text()  # for --status
    assert (dest / "audit" / "audit.json").is_file()
    # again: the same run is kept as it is
    assert main(["compare", "--out", str(tmp_path / "a"), "--export", str(dest)]) == 0
    assert "exported 0 finished run(s) to" in capsys.readouterr().out
    # an earlier export's gzip copy of the same log is the same run: kept as it is (and read on resume, below)
    import gzip
    log = dest / "runs" / "grpo-s0" / "metrics.jsonl.xz"
    log.with_suffix(".gz").write_bytes(gzip.compress(lzma.decompress(log.read_bytes()), mtime=0))
    log.unlink()
    assert main(["compare", "--out", str(tmp_path / "a"), "--export", str(dest)]) == 0
    assert "exported 0 finished run(s) to" in capsys.readouterr().out
    assert sorted(os.listdir(dest / "runs" / "grpo-s0")) == [".credo-kind", "config.yaml", "metrics.jsonl.gz",
                                                             "summary.json"]
    # another comparison's different run under the same name is refused, and nothing is written
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "a", other)
    summary = json.loads((other / "runs" / "grpo-s0" / "summary.json").read_text())
    (other / "runs" / "grpo-s0" / "summary.json").write_text(json.dumps({**summary, "final_accuracy": 0.0}))
    (other / "report.md").write_text("another report\n")
    assert main(["compare", "--out", str(other), "--export", str(dest)]) == 2
    assert "runs/grpo-s0 differs from --out's; nothing was written" in capsys.readouterr().err
    assert (dest / "report.md").read_text() == (tmp_path / "a" / "report.md").read_text()
    assert json.loads((dest / "runs" / "grpo-s0" / "summary.json").read_text()) == summary
    # a machine with another share of the grid adds its runs, but its report covers less than DEST: not copied
    share = tmp_path / "share"
    shutil.copytree(tmp_path / "a", share)
    shutil.move(str(share / "runs" / "grpo-s0"), str(share / "runs" / "grpo-s1"))
    (share / "report.md").write_text("a report of seed 1 alone\n")
    assert main(["compare", "--out", str(share), "--export", str(dest)]) == 0
    assert "the report was not copied, since" in capsys.readouterr().out
    assert sorted(os.listdir(dest / "runs")) == ["grpo-s0", "grpo-s1"]
    assert (dest / "report.md").read_text() == (tmp_path / "a" / "report.md").read_text()
    monkeypatch.setattr(Trainer, "train", lambda self: (_ for _ in ()).throw(AssertionError("retrained")))
    assert main(["compare", "--preset", "smoke", "--methods", "grpo", "--start", saved_policy,
                 "--out", str(dest), "--quiet"]) == 0
    again = json.load(open(dest / "results.json"))
    assert again["methods"]["grpo"]["seeds"]["0"]["curve"] == first["methods"]["grpo"]["seeds"]["0"]["curve"]


def test_export_refuses_a_folder_of_someone_elses_and_one_inside_the_comparison(tmp_path, capsys):
    from credo.cli.main import main
    (tmp_path / "cmp" / "runs" / "grpo-s0").mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl"):
        (tmp_path / "cmp" / "runs" / "grpo-s0" / name).write_text("")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["compare", "--out", str(tmp_path / "cmp"), "--export", str(mine)]) == 2
    assert os.listdir(mine) == ["notes.txt"]
    assert main(["compare", "--out", str(tmp_path / "cmp"), "--export", str(tmp_path / "cmp" / "copy")]) == 2
    assert not (tmp_path / "cmp" / "copy").exists()
    assert main(["compare", "--out", str(tmp_path / "nothing"), "--export", str(tmp_path / "x")]) == 2
    assert main(["compare", "--out", str(tmp_path / "cmp"), "--export", str(tmp_path)]) == 2  # DEST holds OUT
    assert main(["compare", "--out", str(tmp_path / "cmp"), "--export", str(mine), "--force"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 5
    assert "--export" in errors[0] and "is not empty and is not an earlier credo export" in errors[0]
    assert "lies inside it" in errors[1] and "is not a credo comparison" in errors[2]
    assert "or holds it or lies inside it" in errors[3]
    assert "takes no --force" in errors[4] and os.listdir(mine) == ["notes.txt"]


def test_export_never_writes_into_a_live_run(saved_policy, tmp_path, capsys):
    from credo.cli.main import main
    compare("smoke", str(tmp_path / "a"), methods=("grpo",), start=saved_policy, progress=False)
    dest = tmp_path / "b"
    assert main(["compare", "--out", str(tmp_path / "a"), "--export", str(dest)]) == 0
    (dest / "runs" / "grpo-s0" / "summary.json").unlink()  # resumed there and being retrained
    (dest / "runs" / "grpo-s0" / "checkpoints").mkdir()
    assert main(["compare", "--out", str(tmp_path / "a"), "--export", str(dest)]) == 2
    assert "runs/grpo-s0 is a live run (checkpoints)" in capsys.readouterr().err
    assert not (dest / "runs" / "grpo-s0" / "summary.json").exists()


@pytest.mark.slow
def test_runs_from_the_default_start_record_no_path_to_it_and_old_absolute_paths_still_match(tmp_path, monkeypatch):
    """A run's config.yaml says start: '' for the task's default start (the shipped arith SFT start), so a
    comparison moved to another checkout still matches; a run from before, naming this checkout's path to
    it, is reused as the same start, while a different start is refused."""
    import shutil
    import pytest
    import yaml
    from credo.train.sft import ensure_sft
    from credo.train.trainer import Trainer
    out = tmp_path / "cmp"
    first = compare("smoke", str(out), methods=("grpo",), progress=False)
    config_path = out / "runs" / "grpo-s0" / "config.yaml"
    recorded = yaml.safe_load(config_path.read_text())
    assert recorded["start"] == "" and first["start"] == ensure_sft(progress=False)
    recorded["start"] = ensure_sft(progress=False)  # as runs recorded it before
    config_path.write_text(yaml.safe_dump(recorded))
    monkeypatch.setattr(Trainer, "train", lambda self: (_ for _ in ()).throw(AssertionError("retrained")))
    again = compare("smoke", str(out), methods=("grpo",), progress=False)
    assert again["failures"] == {} and again["methods"]["grpo"]["seeds"]["0"]["final_accuracy"] == \
        first["methods"]["grpo"]["seeds"]["0"]["final_accuracy"]
    from credo.core.config import config_hash
    from credo.train.sft_config import sft_config_for
    digest = config_hash(sft_config_for("arith"))
    for elsewhere in (f"/home/someone/credo/src/credo/assets/sft-{digest}", f"/root/.cache/credo/sft/{digest}"):
        recorded["start"] = elsewhere  # another checkout's or cache's copy of the default start: the same start
        config_path.write_text(yaml.safe_dump(recorded))
        assert compare("smoke", str(out), methods=("grpo",), progress=False)["failures"] == {}
    # an explicit --start trains from the path given (never swapped for the cache's copy), and a run that named
    # the default start by a path matches it
    import credo.lab.compare.grid as compare_module
    given = str(tmp_path / "copy" / f"sft-{digest}")
    shutil.copytree(ensure_sft(progress=False), given)
    seen = []
    monkeypatch.setattr(compare_module, "run_one", lambda method, seed, preset, start, *a: seen.append(start) or
                        compare_module.run_result(str(out / "runs" / "grpo-s0")))
    compare("smoke", str(out), methods=("grpo",), start=given, progress=False)
    assert seen == [given]
    recorded["start"] = str(tmp_path / "another-start")
    config_path.write_text(yaml.safe_dump(recorded))
    with pytest.raises(ValueError, match="start: "):
        compare("smoke", str(out), methods=("grpo",), progress=False)


def test_report_only_rebuilds_a_committed_comparison_byte_for_byte(tmp_path, capsys):
    """`credo compare --report-only` on a copy of docs/results/compare-full rewrites report.md and
    results.json with exactly the committed bytes (a report change must be committed with its rebuild)."""
    import shutil
    from credo.cli.main import main
    committed = os.path.join(os.path.dirname(__file__), "..", "docs", "results", "compare-full")
    out = str(tmp_path / "compare-full")
    shutil.copytree(committed, out)
    os.remove(os.path.join(out, "report.md"))  # must be written again, not left in place
    assert main(["compare", "--report-only", "--out", out, "--quiet"]) == 0
    for name in ("report.md", "results.json"):
        with open(os.path.join(committed, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
            assert a.read() == b.read(), name


def test_the_report_sums_the_runs_own_clocks_which_survive_resumption():
    from credo.lab.compare.report import run_clocks
    results = {"protocol": {"jobs": 2}, "methods": {
        "grpo": {"seeds": {"0": {"seconds": 3 * 3600.0}, "1": {"seconds": 2 * 3600.0}}},
        "rredcot": {"seeds": {"0": {"seconds": 1800.0}}}}}
    assert run_clocks(results) == " · the runs' own clocks sum to 5.5 h, 2 at a time"
    assert (run_clocks({"methods": {"grpo": {"seeds": {"0": {"seconds": 600.0}}}}})
            == " · the runs' own clocks sum to 10 min")


def test_equal_updates_add_the_first_count_where_grpo_is_measured():
    """A method of few large updates (VinePPO) stops before GRPO's first evaluation, so the first column
    compares against GRPO's straight line from its start; the table adds the fewest updates of the runs that
    went past GRPO's first evaluation, where every method with a value there is compared with a measurement."""
    from credo.lab.compare.report import report, summarise
    grpo = {"0": _curve_run([(0, 0.30), (10, 0.40), (20, 0.50)], 0.9),
            "1": _curve_run([(0, 0.30), (12, 0.44), (21, 0.52)], 0.9)}
    vine = {"0": _curve_run([(0, 0.30), (4, 0.50)], 0.1), "1": _curve_run([(0, 0.30), (4, 0.52)], 0.1)}
    dapo = {"0": _curve_run([(0, 0.30), (8, 0.40), (15, 0.46)], 0.5),
            "1": _curve_run([(0, 0.30), (9, 0.41), (16, 0.47)], 0.5)}
    results = {"methods": {"grpo": {"seeds": grpo}, "vineppo": {"seeds": vine}, "dapo": {"seeds": dapo}},
               "token_budget": 30_000, "failures": {}, "preset": "t", "start": "s", "commit": "c", "date": "d",
               "machine": "m"}
    summarise(results)
    table = results["equal_updates"]
    assert table["updates"] == [4, 15, 20]  # any run's fewest; fewest past GRPO's first evaluation (12); GRPO's fewest
    # dapo at 15: 0.46 and 0.41 + 0.06 * 6/7; grpo at 15: 0.45 and 0.44 + 0.08 * 3/9
    at15 = table["methods"]["dapo"]["15"]
    assert abs(at15["accuracy_mean"] - (0.46 + 0.41 + 0.06 * 6 / 7) / 2) < 1e-12
    assert abs(at15["delta_vs_grpo"]["mean"] - ((0.46 - 0.45) + (0.41 + 0.06 * 6 / 7 - 0.44 - 0.08 / 3)) / 2) < 1e-12
    assert table["methods"]["vineppo"]["15"]["accuracy_mean"] is None
    assert "15 is the fewest of the runs that went past GRPO's first evaluation on every seed" in report(results)
    # without the cheap method the first count already is past GRPO's first evaluation: no third column
    del results["methods"]["vineppo"]
    summarise(results)
    assert results["equal_updates"]["updates"] == [15, 20]


def test_clipping_counts_steps_above_the_clip_and_takes_the_median_norm():
    from credo.lab.compare.stats import clipping, method_clipping
    run = clipping([0.5, 2.0, 1.0, 3.0], clip=1.0)  # 1.0 is at the clip, not above it
    assert run == {"clipped_share": 0.5, "grad_norm_median": 1.5, "grad_clip": 1.0}
    other = clipping([0.1, 0.2], clip=0.5)
    assert method_clipping({"0": run, "1": other}) == {"clipped_share": 0.25, "grad_norm_median": 0.825,
                                                       "grad_clip": [0.5, 1.0], "runs": 2, "update_norm_median": None}
    # the update size after AdamW: the median over runs, only where every run logged it
    sized = method_clipping({"0": {**run, "update_norm_median": 0.02}, "1": {**other, "update_norm_median": 0.04}})
    assert abs(sized["update_norm_median"] - 0.03) < 1e-12
    assert method_clipping({"0": {**run, "update_norm_median": 0.02}, "1": other})["update_norm_median"] is None
    assert method_clipping({"0": {"final_accuracy": 0.5}}) is None  # runs from before the record


def test_the_report_shows_clipping_per_method_and_reads_out_the_heavily_clipped_and_the_few_updates():
    from credo.lab.compare.report import report, summarise
    results = _synthetic({"grpo": [0.5, 0.6], "ibpo": [0.5, 0.6], "vineppo": [0.4, 0.4]},
                         {"grpo": [None, None], "ibpo": [None, None], "vineppo": [None, None]})
    shares = {"grpo": 0.01, "ibpo": 1.0, "vineppo": 0.2}
    for name, entry in results["methods"].items():
        for seed in entry["seeds"].values():
            seed.update(clipped_share=shares[name], grad_norm_median=19.0 if name == "ibpo" else 0.6, grad_clip=1.0)
            if name == "vineppo":
                seed["steps"] = 5
    summarise(results)
    text = report({**results, "preset": "t", "start": "s", "commit": "c", "date": "d", "machine": "m"})
    assert "| ibpo | 100% | 19.00 | 1 | — |" in text and "| grpo | 1% | 0.60 | 1 | — |" in text
    reading = text.split("## Reading", 1)[1]
    assert "more than half the steps of ibpo (100%) (GRPO: 1%)" in reading and "vineppo (20%)" not in reading
    assert "under half GRPO's updates" in reading and "vineppo (5 against GRPO's 20)" in reading


def test_a_run_result_reads_gradient_norms_and_the_runs_own_clip(tmp_path):
    from credo.lab.compare.runs import run_result
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("method: grpo\ngrad_clip: 0.5\n")
    (run / "summary.json").write_text(json.dumps({"step": 2, "tokens_generated": 10, "seconds": 2.0,
                                                  "final_accuracy": 0.5}))
    rows = [{"step": 0, "tokens_generated": 0, "seconds": 0.0, "eval_accuracy": 0.4},
            {"step": 1, "tokens_generated": 5, "seconds": 1.0, "grad_norm": 0.4, "update_norm": 0.01},
            {"step": 2, "tokens_generated": 10, "seconds": 2.0, "grad_norm": 0.9, "update_norm": 0.03}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_result(str(run))
    assert (result["clipped_share"], result["grad_norm_median"], result["grad_clip"]) == (0.5, 0.65, 0.5)
    assert abs(result["update_norm_median"] - 0.02) < 1e-12


def test_a_comparison_on_the_validation_split_evaluates_there_and_says_so(saved_policy, tmp_path):
    out = str(tmp_path / "val")
    results = compare("smoke", out, methods=("grpo",), start=saved_policy, progress=False, eval_split="validation")
    config = open(os.path.join(out, "runs", "grpo-s0", "config.yaml")).read()
    assert "eval_split: validation" in config
    assert results["protocol"]["eval_split"] == "validation"
    assert results["protocol"]["curve_eval_set"] == "the first 8 validation problems"
    report = open(os.path.join(out, "report.md")).read()
    assert "on the first 8 validation (training-split problems no run trained on" in report
    assert "final: the first 8 validation problems." in report


@pytest.mark.slow
def test_audit_n_zero_skips_the_start_audit_and_nothing_else(saved_policy, tmp_path):
    """The smoke preset audits its start (audit_n=8); audit_n=0 trains and reports the same runs without it."""
    out = str(tmp_path / "no-audit")
    results = compare("smoke", out, methods=("grpo",), start=saved_policy, progress=False, audit_n=0)
    assert results["failures"] == {} and "audit" not in results and "0" in results["methods"]["grpo"]["seeds"]
    assert not os.path.exists(os.path.join(out, "audit")) and not os.path.exists(os.path.join(out, "audit.png"))
    assert os.path.exists(os.path.join(out, "report.md"))


@pytest.mark.slow
def test_a_comparison_measures_the_premises_on_its_start_and_each_final_policy_once(tmp_path, monkeypatch):
    """premise_n > 0: the teacher check for sc_grpo, the localisation check for srpo:localiser=prompt, nothing
    for grpo; each measurement kept in premises/, read back (not measured again) by a rerun; a report section."""
    from dataclasses import replace
    from credo.lab.compare.presets import PRESETS
    from credo.policy.gpt import GPTConfig
    from credo.policy.tiny import TinyPolicy
    from credo.train.sft import make_tokenizer
    from credo.train.sft_config import sft_config_for
    monkeypatch.setitem(PRESETS, "smoke", replace(PRESETS["smoke"], premise_n=16))
    tokenizer = make_tokenizer(sft_config_for("arith-long-skilled"))  # can read the localisation request
    start = str(tmp_path / "reads")
    TinyPolicy.create(GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=1, d_model=32, n_head=2), tokenizer,
                      seed=0).save(start)
    out = str(tmp_path / "cmp")
    results = compare("smoke", out, methods=("sc_grpo", "srpo:localiser=prompt"), start=start, progress=False)
    assert results["failures"] == {}
    premises = results["premises"]
    assert premises["traces"] == 16 and set(premises["methods"]) == {"sc_grpo", "srpo:localiser=prompt"}
    assert "teacher" in premises["start"] and 0 <= premises["start"]["localisers"]["prompt"]["parse_rate"] <= 1
    sc, srpo = premises["methods"]["sc_grpo"]["0"], premises["methods"]["srpo:localiser=prompt"]["0"]
    assert "teacher" in sc and "localisers" not in sc and "teacher" not in srpo and "prompt" in srpo["localisers"]
    assert sorted(os.listdir(os.path.join(out, "premises"))) == ["sc_grpo-s0.json", "srpo_localiser=prompt-s0.json",
                                                                "start.json"]
    text = open(os.path.join(out, "report.md")).read()
    assert "## Premises at the start and at the end of training" in text
    assert "| start | 1 |" in text and "| sc_grpo | 1 |" in text and "| srpo:localiser=prompt | 1 |" in text
    kept = os.path.join(out, "premises", "sc_grpo-s0.json")
    with open(kept) as f:
        saved = json.load(f)
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # noqa: E731 (NaN != NaN)
    assert same(saved["result"], sc) and saved["key"]["teacher"] is True and saved["key"]["split"] == "held-out"
    with open(kept, "w") as f:  # a rerun reads what still matches: a changed figure shows it was not measured again
        json.dump({"key": saved["key"], "result": {**sc, "accuracy": 0.123}}, f)
    stale = os.path.join(out, "premises", "start.json")
    with open(stale) as f:
        start_saved = json.load(f)
    with open(stale, "w") as f:  # measured under another key (e.g. other weights): measured again
        json.dump({"key": {**start_saved["key"], "weights": "another"}, "result": {"accuracy": 0.5}}, f)
    again = compare("smoke", out, methods=("sc_grpo", "srpo:localiser=prompt"), start=start, progress=False)
    assert again["premises"]["methods"]["sc_grpo"]["0"]["accuracy"] == 0.123
    assert same(again["premises"]["start"], premises["start"])
    from credo.lab.compare.export import export
    moved = str(tmp_path / "moved")  # records without weights, with premises/: the kept measurements read back
    export(out, moved)
    assert run_kind(out) == "compare" and sorted(os.listdir(os.path.join(moved, "premises"))) == sorted(
        os.listdir(os.path.join(out, "premises")))
    elsewhere = compare("smoke", moved, methods=("sc_grpo", "srpo:localiser=prompt"), start=start, progress=False)
    assert same(elsewhere["premises"]["methods"], again["premises"]["methods"])
    assert "without_weights" not in elsewhere["premises"]
    other = os.path.join(moved, "runs", "grpo-s9")  # another machine's share: OUT's report is not copied...
    shutil.copytree(os.path.join(moved, "runs", "sc_grpo-s0"), other)
    os.remove(os.path.join(moved, "premises", "sc_grpo-s0.json"))
    assert export(out, moved).only_in_dest == ["grpo-s9"]
    assert os.path.isfile(os.path.join(moved, "premises", "sc_grpo-s0.json"))  # ...but each run's premises are
    shutil.rmtree(other)
    os.remove(os.path.join(moved, "premises", "sc_grpo-s0.json"))  # measured nowhere this folder knows of
    os.remove(os.path.join(moved, "report.md"))
    elsewhere = compare("smoke", moved, methods=("sc_grpo", "srpo:localiser=prompt"), start=start, progress=False)
    assert elsewhere["failures"] == {} and set(elsewhere["premises"]["methods"]) == {"srpo:localiser=prompt"}
    assert elsewhere["premises"]["without_weights"] == ["sc_grpo-s0"]
    assert same(elsewhere["premises"]["start"], premises["start"])
    assert ("Not measured: sc_grpo-s0: finished runs whose final weights this folder does not hold"
            in open(os.path.join(moved, "report.md")).read())


def test_a_runs_premises_are_kept_as_it_finishes_so_an_export_before_the_end_carries_them(tmp_path, monkeypatch,
                                                                                         capsys, saved_policy):
    """A grid spread over machines exports each run as it finishes, without its weights: the run's own premise
    checks must be measured then, on its final policy, not only at the comparison's end; a method that rests on
    no premise measures nothing, and a failing check does not fail the run."""
    from dataclasses import replace
    from credo.lab.audit.reference import checkpoint_digest
    from credo.lab.compare import grid
    from credo.lab.compare.presets import PRESETS
    from credo.lab.compare import premises as premise_checks
    from credo.lab.compare.export import describe, export
    preset = replace(PRESETS["smoke"], premise_n=8, methods=("grpo", "sc_grpo"))
    start = saved_policy
    runs = tmp_path / "cmp" / "runs"
    pending = tmp_path / "cmp" / "premises" / "sc_grpo-s0.pending"
    real_trainer, seen = grid.Trainer, []

    def trainer(*args, **kwargs):  # the marker is there before summary.json can be
        seen.append(pending.exists())
        return real_trainer(*args, **kwargs)
    monkeypatch.setattr(grid, "Trainer", trainer)
    result = grid.run_one("sc_grpo", 0, preset, start, str(runs / "sc_grpo-s0"), None)
    assert result["final_accuracy"] is not None and seen == [True] and not pending.exists()
    with open(tmp_path / "cmp" / "premises" / "sc_grpo-s0.json") as f:
        kept = json.load(f)
    assert kept["key"]["weights"] == checkpoint_digest(str(runs / "sc_grpo-s0" / "final"))
    assert kept["key"]["teacher"] is True and "teacher" in kept["result"]
    grid.run_one("grpo", 0, preset, start, str(runs / "grpo-s0"), None)
    assert os.listdir(tmp_path / "cmp" / "premises") == ["sc_grpo-s0.json"] and seen == [True, False]
    measured = []  # the comparison's end reads the run's checks back under the same key: only the start is new
    real_measure = premise_checks.measure_premises
    monkeypatch.setattr(premise_checks, "measure_premises", lambda policy, *a: measured.append(a) or real_measure(
        policy, *a))
    plan = [(m, 0, str(runs / f"{m}-s0")) for m in ("grpo", "sc_grpo")]
    import torch
    at_end = premise_checks.premises_at_end(plan, preset, start, str(tmp_path / "cmp"), torch.device("cpu"), False)
    assert len(measured) == 1 and at_end["methods"]["sc_grpo"]["0"] == kept["result"]
    pending.write_text("")  # a run exported while its checks are still being measured says so
    done = export(str(tmp_path / "cmp"), str(tmp_path / "moved"))
    assert done.checks_pending == ["sc_grpo-s0"]
    assert "sc_grpo-s0 went without its premise checks" in describe(done, "moved")
    pending.unlink()
    assert export(str(tmp_path / "cmp"), str(tmp_path / "moved")).checks_pending == []

    def broken(*args):
        raise ValueError("no teacher today")
    monkeypatch.setattr(grid, "premises_of_finished_run", broken)
    again = grid.run_one("sc_grpo", 0, preset, start, str(runs / "sc_grpo-s0"), None)  # finished: reused
    assert again == result
    assert "premise checks of" in capsys.readouterr().err


def test_the_curves_name_the_set_they_were_measured_on(tmp_path):
    """A comparison on the validation split must not label its curves held-out (the selection runs are)."""
    from credo.lab.compare.plots import eval_set, plot_curves
    curve = [{"step": 0, "tokens_generated": 0, "accuracy": 0.5}, {"step": 4, "tokens_generated": 100, "accuracy": 0.6}]
    results = {"methods": {"grpo": {"seeds": {"0": {"curve": curve}}}}, "protocol": {"eval_split": "validation"}}
    assert eval_set(results) == "validation"
    assert eval_set({"methods": {}, "protocol": {}}) == "held-out"
    plot_curves(results, str(tmp_path / "curves.png"))  # one panel: the long title wraps instead of being cut
    assert os.path.getsize(tmp_path / "curves.png") > 1000


def test_a_long_method_name_breaks_at_its_colons_and_a_privileged_one_is_marked():
    from credo.lab.compare.plots import panel_title
    assert panel_title("grpo", 1) == "grpo (1 seed)"
    assert panel_title("rredcot", 5, privileged=True) == "rredcot † (5 seeds)"
    assert panel_title("retired_method", 2, privileged=None) == "retired_method †? (2 seeds)"
    long = panel_title("shuffled:of=tempo:options.of=rredcot:include_reference=false", 5)
    assert long.replace("\n", "") == "shuffled:of=tempo:options.of=rredcot:include_reference=false (5 seeds)"
    assert all(len(line) <= 34 for line in long.split("\n")) and all(
        line.endswith(":") for line in long.split("\n")[:-1])


def test_a_run_result_records_the_overlong_penalty_it_applied_fitted_or_as_set(tmp_path):
    """DAPO's overlong penalty acts unequally (a method that shapes rewards by length): the report states where
    it starts and whether it was fitted to the task (summary.json: overlong_buffer_used, longest_worked_solution)."""
    from credo.lab.compare.report import report, summarise
    from credo.lab.compare.runs import run_result
    from credo.lab.compare.unequal import overlong_sentences

    def run(name, config, summary):
        path = tmp_path / name
        path.mkdir()
        (path / "config.yaml").write_text(config)
        (path / "summary.json").write_text(json.dumps({"step": 1, "tokens_generated": 10, "seconds": 1.0,
                                                       "final_accuracy": 0.5, **summary}))
        (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens_generated": 10, "seconds": 1.0}) + "\n")
        return run_result(str(path))

    sampling = "sampling:\n  max_new_tokens: 96\n"
    fitted = run("fitted", "method: dapo\noverlong_buffer: 16\noverlong_fit_task: true\n" + sampling,
                 {"overlong_buffer_used": 1, "longest_worked_solution": 95})
    as_set = run("set", "method: dapo\noverlong_buffer: 16\n" + sampling, {})
    plain = run("plain", "method: grpo\noverlong_buffer: 0\n" + sampling, {})
    off = run("off", "method: dapo\noverlong_buffer: 16\noverlong_penalty: 0.0\n" + sampling, {})  # shapes nothing
    filled = run("filled", "method: dapo\noverlong_buffer: 16\noverlong_fit_task: true\n" + sampling,
                 {"overlong_buffer_used": 0, "longest_worked_solution": 96})
    assert fitted["overlong"] == {"buffer": 1, "max_new_tokens": 96, "longest_worked_solution": 95,
                                  "fit_problems": 256}
    assert as_set["overlong"] == {"buffer": 16, "max_new_tokens": 96, "longest_worked_solution": None}
    assert "overlong" not in plain and "overlong" not in off
    assert overlong_sentences({"methods": {"dapo": {"seeds": {"0": filled}}}}, str) == [
        "dapo applies no overlong penalty: fitted to the task, the buffer is 0 (the longest worked solution of 256 "
        "training problems, 96 tokens, fills the 96-token limit)."]
    both = {"methods": {"dapo": {"seeds": {"0": fitted}}, "dapo:of=rloo": {"seeds": {"0": fitted, "1": fitted}}}}
    assert overlong_sentences(both, str) == [  # one penalty, one sentence naming every method that applied it
        "dapo and dapo:of=rloo penalise completions that reach into the last 1 of 96 new tokens (DAPO's overlong "
        "penalty), fitted to the task so that no worked solution of 256 training problems reaches it (the longest "
        "is 95 tokens)."]
    results = _synthetic({"grpo": [0.5, 0.6], "dapo": [0.5, 0.6], "dapo:overlong_fit_task=false": [0.5, 0.6]},
                         {"grpo": [None, None], "dapo": [None, None], "dapo:overlong_fit_task=false": [None, None]})
    for seed in results["methods"]["dapo"]["seeds"].values():
        seed["overlong"] = fitted["overlong"]
    for seed in results["methods"]["dapo:overlong_fit_task=false"]["seeds"].values():
        seed["overlong"] = as_set["overlong"]
    sentences = overlong_sentences(results, str)
    assert sentences == [
        "dapo penalises completions that reach into the last 1 of 96 new tokens (DAPO's overlong penalty), fitted "
        "to the task so that no worked solution of 256 training problems reaches it (the longest is 95 tokens).",
        "dapo:overlong_fit_task=false penalises completions that reach into the last 16 of 96 new tokens (DAPO's "
        "overlong penalty), as set, not fitted to the task: a correct solution that long is penalised too."]
    summarise(results)
    text = report({**results, "preset": "t", "start": "s", "commit": "c", "date": "d", "machine": "m"})
    assert "## What acts unequally on methods: DAPO's overlong penalty" in text and sentences[0] in text
    for entry in results["methods"].values():  # beside a clipping table: its own paragraph under that section
        for seed in entry["seeds"].values():
            seed.update(clipped_share=0.5, grad_norm_median=1.0, grad_clip=1.0)
    summarise(results)
    text = report({**results, "preset": "t", "start": "s", "commit": "c", "date": "d", "machine": "m"})
    assert "## What acts unequally on methods: gradient-norm clipping" in text
    assert "**DAPO's overlong penalty.** " + sentences[0] in text


def test_the_estimate_includes_the_start_audit_and_the_premise_checks(monkeypatch, tmp_path, saved_policy):
    """Before, the estimate was the training's only: 0 s for a comparison whose runs had all finished, which then
    spent minutes on its audit and premise checks."""
    from dataclasses import replace
    import credo.lab.compare.eta as eta
    from credo.lab.compare.presets import resolve_preset
    monkeypatch.setattr(eta, "time_evaluation", lambda config, threads=None: 8.0)
    preset = resolve_preset("smoke", ("grpo",), (0,), None, None)
    plan = [("grpo", 0, str(tmp_path / "runs" / "grpo-s0"))]
    done = tmp_path / "runs" / "grpo-s0"
    done.mkdir(parents=True)
    (done / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens_generated": 150, "seconds": 2.0}) + "\n")
    (done / "summary.json").write_text(json.dumps({"step": 1, "tokens_generated": 150, "seconds": 2.0,
                                                   "final_accuracy": 0.5}))
    out = eta.estimate_wall_time(plan, preset, saved_policy, jobs=1)
    per = 8.0 / preset.eval_n
    audit = preset.audit_n * (1 + preset.audit_k_ref * eta.steps_per_trace(preset) / 2) * per
    assert out["runs"] == 0 and out["audit_seconds"] == round(audit, 1) > 0 and out["seconds"] == out["audit_seconds"]
    skilled = replace(preset, methods=("grpo", "sc_grpo", "srpo:localiser=prompt"), premise_n=16, audit_n=0)
    out = eta.estimate_wall_time([], skilled, saved_policy, jobs=1)
    policies = 1 + 2  # the start, and the final policy of each method resting on a premise (one seed)
    assert out["audit_seconds"] == 0 and out["premise_seconds"] == round(16 * policies * 2 * per, 1)


def test_export_each_exports_as_each_trained_run_ends_and_again_with_the_report(saved_policy, tmp_path, monkeypatch,
                                                                              capsys):
    """compare.export_each: a machine lost mid-comparison loses only the runs in flight. Each run trained (or
    checked) here is exported as it ends, a run only read back is not exported again, the end adds the report; a
    DEST inside --out is refused before anything is timed or written; a failing export does not stop the grid."""
    import credo.lab.compare.grid as grid
    from credo.cli.main import main
    from credo.lab.compare.presets import resolve_preset
    out, dest = tmp_path / "a", tmp_path / "exported"
    assert main(["compare", "--preset", "smoke", "--methods", "grpo", "--start", saved_policy, "--out", str(out),
                 "--export-each", str(out / "inside"), "--quiet"]) == 2
    assert f"--export-each {out / 'inside'} is --out" in capsys.readouterr().err and not out.exists()
    import credo.lab.compare.export as export_module
    exports, real_export = [], export_module.export
    monkeypatch.setattr(export_module, "export", lambda o, d, flag: exports.append(sorted(os.listdir(os.path.join(
        o, "runs")))) or real_export(o, d, flag))
    results = compare("smoke", str(out), methods=("grpo",), seeds=(0, 1), start=saved_policy, progress=False,
                      export_each=str(dest), audit_n=0)
    assert exports == [["grpo-s0"], ["grpo-s0", "grpo-s1"], ["grpo-s0", "grpo-s1"]]  # as each ends; the report
    assert sorted(os.listdir(dest / "runs")) == ["grpo-s0", "grpo-s1"]
    assert (dest / "report.md").read_text() == (out / "report.md").read_text() and results["methods"]["grpo"]
    # resumed: both runs are only read back; exported once before any training (they may never have been) and
    # once at the end, not after each
    exports.clear()
    compare("smoke", str(out), methods=("grpo",), seeds=(0, 1), start=saved_policy, progress=False,
            export_each=str(dest), audit_n=0)
    assert len(exports) == 2
    # --force starts --out afresh: an export holding the old runs would refuse every new one, so it is refused now
    assert main(["compare", "--preset", "smoke", "--methods", "grpo", "--start", saved_policy, "--out", str(out),
                 "--force", "--export-each", str(dest), "--quiet"]) == 2
    assert "holds finished runs of an earlier export, and --force" in capsys.readouterr().err
    assert main(["compare", "--out", str(out), "--status", "--export-each", str(dest)]) == 2
    assert "--export-each exports a comparison as its runs end, so it takes no --status" in capsys.readouterr().err
    # a refused export is said, and the runs go on
    preset = resolve_preset("smoke", ("grpo",), (0, 1), None, None)
    plan = [("grpo", s, str(tmp_path / "c" / "runs" / f"grpo-s{s}")) for s in (0, 1)]
    monkeypatch.setattr(export_module, "export", real_export)
    monkeypatch.setattr(grid, "run_one", lambda m, seed, *a, **k: {"seed": seed})
    (tmp_path / "c").mkdir()  # not a comparison: every export is refused
    said = []
    monkeypatch.setattr(export_module.tqdm, "write", lambda text, file=None: said.append(text))
    outcomes = grid.train_all(plan, preset, "", jobs=1, progress=False,
                              after_each=export_module.exporter(str(tmp_path / "c"), str(dest)))
    assert [result["seed"] for result, _ in outcomes] == [0, 1] and len(said) == 2
    assert all("export to" in line and "failed" in line and "is not a credo comparison" in line for line in said)
