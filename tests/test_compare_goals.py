"""How a comparison judges the seed papers' claims (credo.lab.compare.goals): the choice of the best credit method
is paid for, GRPO's tokens are its whole run, a run that never reaches counts later than one that does, and a
goal whose methods failed reads 'not judged' instead of vanishing."""

from __future__ import annotations

from credo.lab.compare.goals import BEST, BEST_UNPRIVILEGED, CONTROLS, SC, SRPO, goals
from credo.lab.compare.report import report, summarise


def _run(final: float, reach_at: int | None, tokens: int = 200_000, step_seconds: float = 0.1,
         end: float | None = None) -> dict:
    """One run: a curve point at `reach_at` tokens scoring 0.99 (or 0.0 at 100k when None), its last curve point
    scoring `final` (`end`: its own score there), then the final evaluation on the larger set."""
    curve = [{"step": 0, "tokens_generated": 0, "seconds": 0, "accuracy": 0.3},
             {"step": 10, "tokens_generated": reach_at or 100_000, "seconds": 1, "accuracy": 0.99 if reach_at else 0.0},
             {"step": 20, "tokens_generated": tokens, "seconds": 2, "accuracy": final if end is None else end},
             {"step": 20, "tokens_generated": tokens, "seconds": 2, "accuracy": final, "final": True}]
    return {"curve": curve, "final_accuracy": final, "seconds_per_step": step_seconds, "steps": 20,
            "tokens_generated": tokens}


def _results(methods: dict[str, list[dict]], protocol: dict | None = None) -> dict:
    results = {"methods": {m: {"seeds": {str(i): r for i, r in enumerate(runs)}} for m, runs in methods.items()},
               "token_budget": 200_000, "failures": {}, "preset": "t", "start": "s", "commit": "c", "date": "d",
               "machine": "m", "protocol": protocol}
    summarise(results)
    return results


def _goal(results: dict, goal: str) -> dict:
    return {g["goal"]: g for g in goals(results)}[goal]


GRPO = [_run(0.40, 100_000), _run(0.42, 100_000), _run(0.44, 100_000)]


def test_the_best_of_several_credit_methods_needs_its_interval_widened_for_the_choice():
    # rredcot +6, +7, +6.5 points: the 95% interval is [+5.3, +7.7], the one at 1 - 0.05/4 [+3.9, +9.1]...
    rredcot = [_run(0.46, 40_000), _run(0.49, 40_000), _run(0.505, 40_000)]
    others = {m: [_run(0.40, None), _run(0.42, None), _run(0.44, None)] for m in ("sc_grpo", "ibpo", "vineppo")}
    results = _results({"grpo": GRPO, "rredcot": rredcot, **others})
    best = _goal(results, BEST)
    assert "best of 4 credit methods by Δ vs GRPO: rredcot" in best["evidence"]
    assert "at 98.8% for the choice among 4" in best["evidence"] and best["holds"] is True
    # ...a wider spread leaves the plain 95% interval above 0 but not the one paid for the choice among 4
    rredcot = [_run(0.45, 40_000), _run(0.48, 40_000), _run(0.515, 40_000)]  # +5, +6, +7.5: [+3.0, +9.3] at 95%
    results = _results({"grpo": GRPO, "rredcot": rredcot, **others})
    delta = results["methods"]["rredcot"]["delta_vs_grpo"]
    assert delta["ci"][0] > 0 and delta["mean"] >= 0.05
    assert _goal(results, BEST)["holds"] is False


def test_tokens_are_compared_with_grpos_own_counted_the_same_way():
    """GRPO's curves reach its end accuracy at 100k: 0.5x is 50k. (Dividing by GRPO's whole 200k-token run would
    let GRPO's own noisy early crossing pass the bar: 0.5x of its run.)"""
    for reach, holds in {45_000: True, 60_000: False}.items():
        rredcot = [_run(0.50, reach), _run(0.52, reach), _run(0.54, reach)]  # +10 points on every seed
        results = _results({"grpo": GRPO, "rredcot": rredcot})
        assert abs(results["methods"]["rredcot"]["tokens_to_grpo_end_ratio"] - reach / 100_000) < 1e-12
        assert results["methods"]["grpo"]["tokens_to_grpo_end_ratio"] == 1.0
        goal = _goal(results, BEST)
        assert goal["holds"] is holds
        # the earliest evaluation of any run bounds what can be seen: here rredcot's own, at `reach`
        assert f"floor of {reach / 100_000:.2f}x" in goal["evidence"]
    rredcot = [_run(0.50, 45_000), _run(0.52, 45_000), _run(0.54, None)]  # one seed never reaches it
    assert _goal(_results({"grpo": GRPO, "rredcot": rredcot}), BEST)["holds"] is False


def test_the_accuracy_to_reach_is_grpos_on_the_curves_problems_not_its_final_on_the_larger_set():
    """The curve's problems are easier here: GRPO ends at 0.48 on them (mean of 0.46, 0.48, 0.50), at 0.42 on the
    final set. A method whose curve passes 0.45 at 50k and 0.49 only at its end reaches GRPO's level at its end,
    not at 50k (against the final set's 0.42 it would have, at 0.25x GRPO's tokens); and a final evaluation on
    the larger set is never counted as a crossing."""
    grpo = [_run(final, None, end=final + 0.06) for final in (0.40, 0.42, 0.44)]

    def passing_early() -> dict:
        run = _run(0.43, None, end=0.49)
        run["curve"][1] = {"step": 5, "tokens_generated": 50_000, "seconds": 1, "accuracy": 0.45}
        return run
    results = _results({"grpo": grpo, "sc_grpo": [passing_early() for _ in range(3)],
                        "rrpo": [_run(0.60, None, end=0.40)]})
    assert abs(results["grpo_end_target"] - 0.48) < 1e-12
    assert [r["tokens_to_grpo_end"] for r in results["methods"]["sc_grpo"]["seeds"].values()] == [200_000] * 3
    assert results["methods"]["grpo"]["seeds_reaching_grpo_end"] == 2  # 0.46 < 0.48 on seed 0
    assert results["methods"]["sc_grpo"]["tokens_to_grpo_end_ratio"] == 1.0
    assert results["methods"]["rrpo"]["seeds"]["0"]["tokens_to_grpo_end"] is None  # its final, 0.60, is not a point


def test_a_run_that_never_reaches_counts_later_than_one_that_reaches_at_its_end():
    """srpo reaches on its last evaluations (200k, 200k, 190k); rrpo never does (its curves end below GRPO's end
    accuracy, 0.43): each of its seeds counts as 200k + one 50k interval, so srpo − rrpo is -50k, -50k, -60k.
    (Counted as the budget, 200k, reaching at the end looked slower than never reaching.) Their sd, 5.8k, is
    under what rounding each count up to its 50k evaluation gives a difference (50k / sqrt(6) = 20.4k): floored
    there, t(2) = 4.303 -> half-width 50.7k (unfloored [-68k, -39k])."""
    srpo = [_run(0.41, 200_000), _run(0.43, 200_000), _run(0.45, 190_000)]
    rrpo = [_run(0.40, None), _run(0.40, None), _run(0.40, None)]
    grpo = [_run(0.41, None), _run(0.43, None), _run(0.45, None)]  # seeds 1 and 2 reach at their end (200k)
    goal = _goal(_results({"grpo": grpo, "rrpo": rrpo, "srpo:localiser=prompt": srpo}), SRPO)
    assert "srpo:localiser=prompt − rrpo -53k [-104k, -3k]" in goal["evidence"]
    assert "srpo:localiser=prompt − grpo -20k" in goal["evidence"] and goal["holds"] is False  # -50k, 0, -10k


def test_a_privileged_row_never_alone_answers_a_claim_about_methods_that_read_no_reference():
    """srpo's default `self` localiser may read the reference (†), rredcot's default value does: they are shown,
    but the SRPO claim waits for an unprivileged row, and goal (1) gets a row among the methods without †."""
    fast = [_run(0.50, 40_000), _run(0.52, 40_000), _run(0.54, 40_000)]
    slow = [_run(0.40, None), _run(0.42, None), _run(0.44, None)]
    ibpo = [_run(0.41, None), _run(0.43, None), _run(0.45, None)]  # +1 point on every seed
    results = _results({"grpo": GRPO, "rrpo": slow, "srpo": fast, "rredcot": fast, "ibpo": ibpo})
    assert results["methods"]["srpo"]["privileged"] and results["methods"]["rredcot"]["privileged"]
    srpo = _goal(results, SRPO)
    assert srpo["holds"] is None and "(srpo †) read the task's reference" in srpo["evidence"]
    assert _goal(results, BEST)["holds"] is True  # rredcot †, +10 points
    fair = _goal(results, BEST_UNPRIVILEGED)  # among rrpo and ibpo (srpo and rredcot †)
    assert fair["holds"] is False and "best of 2 credit methods by Δ vs GRPO: ibpo, +1.0" in fair["evidence"]
    # an unprivileged srpo row answers, and the privileged one is named beside it
    results = _results({"grpo": GRPO, "rrpo": slow, "srpo": fast, "srpo:localiser=prompt": fast})
    srpo = _goal(results, SRPO)
    assert srpo["holds"] is True
    assert "(not judged here, as they read or may read the reference: srpo †)" in srpo["evidence"]
    # an srpo row that does not ask the policy (random resets: RRPO) is no self-localisation
    srpo = _goal(_results({"grpo": GRPO, "rrpo": slow, "srpo:localiser=random": fast}), SRPO)
    assert srpo["holds"] is None and "no srpo row in the grid localises by asking the policy" in srpo["evidence"]
    assert BEST_UNPRIVILEGED not in {g["goal"] for g in goals(_results({"grpo": GRPO, "ibpo": fast}))}


def test_sc_grpo_must_also_beat_its_token_level_control_and_without_one_that_half_is_not_judged():
    sc = [_run(0.50, None), _run(0.52, None), _run(0.54, None)]
    results = _results({"grpo": GRPO, "sc_grpo": sc, "shuffled:of=sc_grpo:level=token": sc})
    goal = _goal(results, SC)
    assert goal["holds"] is False and "sc_grpo − shuffled:of=sc_grpo:level=token: +0.0" in goal["evidence"]
    below = [_run(0.46, None), _run(0.48, None), _run(0.50, None)]
    results = _results({"grpo": GRPO, "sc_grpo": sc, "shuffled:of=sc_grpo:level=token": below})
    assert _goal(results, SC)["holds"] is True
    # a segment-level control only: above GRPO is half the claim, so it is not judged (it read "yes" before)...
    results = _results({"grpo": GRPO, "sc_grpo": sc, "shuffled:of=sc_grpo": GRPO})
    goal = _goal(results, SC)
    assert goal["holds"] is None
    assert goal["evidence"] == ("sc_grpo +10.0 [+10.0, +10.0] points (Holm p < 0.001 among 2; simultaneous "
                                "[+10.0, +10.0]) vs GRPO (paired over 3 seeds); not judged: no "
                                "token-level control in the grid (shuffled:of=sc_grpo:level=token)")
    # ...but SC-GRPO below GRPO fails the claim whatever its control would have said
    results = _results({"grpo": GRPO, "sc_grpo": GRPO, "shuffled:of=sc_grpo": GRPO})
    assert _goal(results, SC)["holds"] is False


def test_a_goal_failed_on_a_judged_comparison_is_a_no_while_another_comparison_lacks_seeds():
    """'Every method above its control': one judged pair below its control decides it; one judged pair above
    and one without seeds leaves it open."""
    above = [_run(0.50, None), _run(0.52, None), _run(0.54, None)]
    results = _results({"grpo": GRPO, "rredcot": GRPO, "shuffled:of=rredcot": GRPO, "sc_grpo": above,
                        "shuffled:of=sc_grpo": [_run(0.40, None)]})
    goal = _goal(results, CONTROLS)
    assert goal["holds"] is False
    assert goal["evidence"] == ("rredcot − shuffled:of=rredcot: +0.0 [+0.0, +0.0] points (Holm p 1.000 among 1; "
                                "simultaneous [+0.0, +0.0]); not judged: sc_grpo and "
                                "shuffled:of=sc_grpo share 1 finished seed(s)")
    results = _results({"grpo": GRPO, "rredcot": above, "shuffled:of=rredcot": GRPO, "sc_grpo": above,
                        "shuffled:of=sc_grpo": [_run(0.40, None)]})
    assert _goal(results, CONTROLS)["holds"] is None


def test_srpo_is_judged_against_an_rrpo_row_under_either_name_and_without_one_only_against_grpo():
    fast = [_run(0.50, 40_000), _run(0.52, 40_000), _run(0.54, 40_000)]
    slow = [_run(0.40, None), _run(0.42, None), _run(0.44, None)]
    results = _results({"grpo": GRPO, "srpo:localiser=random": slow, "srpo:localiser=prompt": fast})
    goal = _goal(results, SRPO)
    assert goal["holds"] is True and "srpo:localiser=prompt − srpo:localiser=random -177k" in goal["evidence"]
    # without an RRPO row (the goal used to vanish) that half is open: 60k sooner than GRPO on every seed
    goal = _goal(_results({"grpo": GRPO, "srpo:localiser=prompt": fast}), SRPO)
    assert goal["holds"] is None
    assert "srpo:localiser=prompt − grpo -60k [-111k, -9k]" in goal["evidence"]
    assert goal["evidence"].endswith("not judged: no RRPO row in the grid (rrpo, or srpo:localiser=random)")
    # ...and an SRPO that never reaches GRPO's end accuracy fails the GRPO half, so the goal is a no whatever RRPO does
    assert _goal(_results({"grpo": GRPO, "srpo:localiser=prompt": slow}), SRPO)["holds"] is False


def test_the_sd_floor_decides_a_verdict_that_exact_agreement_would_have_passed():
    """+10 points on every seed: a zero spread makes a zero-width interval above 0. On a final evaluation of 10
    problems one problem is 10 points, so the sd is floored there and the same seeds no longer resolve it."""
    sc = [_run(0.50, None), _run(0.52, None), _run(0.54, None)]
    methods = {"grpo": GRPO, "sc_grpo": sc, "shuffled:of=sc_grpo:level=token": GRPO}
    assert _goal(_results(methods), CONTROLS)["holds"] is True  # no evaluation size recorded: no floor
    results = _results(methods, protocol={"final_eval_n": 10, "eval_n": 10, "eval_every_tokens": 50_000})
    control = _goal(results, CONTROLS)
    # t(2) = 4.303 x 10 / sqrt(3) = 24.8 points
    assert control["holds"] is False and "+10.0 [-14.8, +34.8]" in control["evidence"]
    assert results["methods"]["sc_grpo"]["delta_vs_grpo"]["sd_floored"] is True


def test_one_problems_worth_comes_from_the_protocol_or_from_results_older_than_it():
    from credo.lab.compare.stats import resolution
    assert resolution({"protocol": {"final_eval_n": 1000, "eval_n": 300}}) == 1 / 1000
    assert resolution({"protocol": {"final_eval_n": 1000, "eval_n": 300}}, final=False) == 1 / 300
    assert resolution({"protocol": None, "final_eval_n": 500}) == 1 / 500  # e.g. docs/results/rredcot-check
    assert resolution({"protocol": None}) == 0.0


def test_a_method_this_version_no_longer_knows_answers_no_claim_about_unprivileged_methods():
    gone = [_run(0.50, 40_000), _run(0.52, 40_000), _run(0.54, 40_000)]
    ibpo = [_run(0.41, None), _run(0.43, None), _run(0.45, None)]
    results = _results({"grpo": GRPO, "retired_method": gone, "ibpo": ibpo})
    assert results["methods"]["retired_method"]["privileged"] is None
    assert "no longer knows retired_method" in _goal(results, BEST)["evidence"]
    fair = _goal(results, BEST_UNPRIVILEGED)
    assert "the only credit method, ibpo" in fair["evidence"] and fair["holds"] is False
    text = report(results)
    assert "| retired_method †? |" in text and "†? a method this version of credo no longer knows" in text
    assert ("this version of credo no longer knows retired_method (†?: whether it reads privileged data cannot be "
            "told); the best method known to read none is ibpo at 0.430.") in text  # the Reading
    # an unknown sc_grpo variant is not said to read the reference: it may
    unknown = _goal(_results({"grpo": GRPO, "sc_grpo:bogus=1": gone}), SC)
    assert unknown["holds"] is None and "(sc_grpo:bogus=1 †?)" in unknown["evidence"]


def test_a_goal_whose_methods_share_under_2_seeds_reads_not_judged_and_other_goals_are_still_judged():
    results = _results({"grpo": GRPO, "sc_grpo": [], "rredcot": [_run(0.50, 40_000), _run(0.52, 40_000),
                                                                  _run(0.54, 40_000)],
                        "shuffled:of=rredcot": [_run(0.40, None)]})
    sc = _goal(results, SC)
    assert sc["holds"] is None and "sc_grpo and grpo share 0 finished seed(s)" in sc["evidence"]
    controls = _goal(results, CONTROLS)
    assert (controls["holds"] is None
            and "rredcot and shuffled:of=rredcot share 1 finished seed(s)" in controls["evidence"])
    best = _goal(results, BEST)  # rredcot and GRPO share 3 seeds: judged, whatever the control did
    assert best["holds"] is True and "sc_grpo" in best["evidence"]  # left out, fewer than 2 seeds
    assert f"| {SC} | not judged |" in report(results)
    # finished on 2 seeds each, but not the same 2: no paired interval, so no verdict (not a "no")
    results = _results({"grpo": GRPO[:2], "sc_grpo": [_run(0.60, None), _run(0.60, None)]})
    results["methods"]["sc_grpo"]["seeds"] = {"1": results["methods"]["sc_grpo"]["seeds"]["1"], "2": _run(0.6, None)}
    summarise(results)
    assert _goal(results, SC)["holds"] is None


def test_every_credit_method_means_those_with_a_control_and_the_others_are_named():
    rredcot = [_run(0.50, None), _run(0.52, None), _run(0.54, None)]
    control = [_run(0.40, None), _run(0.42, None), _run(0.44, None)]
    results = _results({"grpo": GRPO, "rredcot": rredcot, "shuffled:of=rredcot": control, "vineppo": control})
    goal = _goal(results, CONTROLS)
    assert goal["holds"] is True and "(no control in the grid: vineppo)" in goal["evidence"]


def test_step_time_ratios_show_their_spread_over_seeds():
    slow = [_run(0.40, None, step_seconds=0.2), _run(0.42, None, step_seconds=0.1), _run(0.44, None, step_seconds=0.3)]
    results = _results({"grpo": GRPO, "sc_grpo": slow})
    entry = results["methods"]["sc_grpo"]
    assert abs(entry["step_time_ratio"] - 2.0) < 1e-12
    assert [round(x, 9) for x in entry["step_time_ratio_range"]] == [1.0, 3.0]
    assert "| 2.00 (1.00-3.00) |" in report(results)


def test_equal_updates_warn_where_grpo_is_interpolated_from_its_start():
    results = _results({"grpo": GRPO, "vineppo": [_run(0.40, None), _run(0.42, None), _run(0.44, None)]})
    for runs in results["methods"]["vineppo"]["seeds"].values():  # vineppo stops after 4 updates
        runs["curve"] = [dict(p, step=min(p["step"], 4)) for p in runs["curve"]]
    summarise(results)
    text = report(results)
    assert ("At 4 update(s) GRPO had not been evaluated yet on some seed "
            "(its first evaluation came at step 10-10)") in text


def test_a_control_names_the_method_it_controls_with_the_options_handed_to_it():
    """A nested control is paired with its own method, not with the outer wrapper's bare name (tempo alone
    is another method than tempo:of=rredcot:include_reference=false)."""
    from credo.lab.compare.stats import control_target
    assert control_target("shuffled:of=tempo:options.of=rredcot:include_reference=false") == \
        "tempo:of=rredcot:include_reference=false"
    assert control_target("shuffled:of=sc_grpo:level=token") == "sc_grpo"  # level is the control's own option
    assert control_target("shuffled:of=rredcot:lam=0.25") == "rredcot:lam=0.25"
    assert control_target("tempo:of=rredcot") is None


def test_exactly_five_points_meets_the_goal_whatever_the_float_sum():
    """0.450-0.400, 0.471-0.420, 0.489-0.440 average to 0.04999999999999999 in floats: +5.0 points, which holds."""
    ibpo = [_run(0.450, 40_000), _run(0.471, 40_000), _run(0.489, 40_000)]
    results = _results({"grpo": GRPO, "ibpo": ibpo})
    assert results["methods"]["ibpo"]["delta_vs_grpo"]["mean"] < 0.05  # the float sum this test is about
    assert _goal(results, BEST)["holds"] is True


def test_a_baseline_with_options_is_not_a_credit_method():
    from credo.lab.compare.goals import credit_methods
    assert credit_methods(["grpo", "grpo:std=population", "dapo:overlong_buffer=8", "rredcot",
                           "shuffled:of=rredcot"]) == ["rredcot"]


def test_a_control_finds_its_method_whatever_the_order_of_their_options():
    method = "rredcot:lam=0.25:include_reference=false"
    control = "shuffled:of=rredcot:include_reference=false:lam=0.25"
    better = [_run(0.46, 100_000), _run(0.47, 100_000), _run(0.49, 100_000)]
    results = _results({"grpo": GRPO, method: better, control: GRPO})
    pair = results["controls"][0]
    assert pair["method"] == method and pair["delta"]["mean"] > 0.04


def test_holm_adjusts_a_family_step_down_in_its_own_order():
    from credo.lab.compare.stats import holm
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept monotone at 0.06
    assert [round(p, 12) for p in holm([0.01, 0.04, 0.03, 0.005])] == [0.03, 0.06, 0.06, 0.02]
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1


def test_a_p_value_is_where_the_paired_interval_touches_zero():
    from credo.lab.compare.stats import paired
    deltas = [0.02, 0.05, 0.01, 0.04]
    p = paired(deltas)["p"]
    low, _ = paired(deltas, level=1 - p)["ci"]
    assert 0 < p < 0.05 and abs(low) < 1e-12


def test_a_difference_resolved_alone_is_not_resolved_once_its_family_is_paid_for():
    """One control pair at about p = 0.02 holds alone; beside four pairs with nothing to find, Holm multiplies it
    by 5 and the claim 'every method above its control' is no longer met on corrected figures."""
    method = [_run(0.50, None), _run(0.52, None), _run(0.55, None)]  # +3, +4, +5 over the control: p ~ 0.02
    control = [_run(0.47, None), _run(0.48, None), _run(0.50, None)]
    alone = _results({"grpo": GRPO, "rredcot": method, "shuffled:of=rredcot": control})
    delta = alone["controls"][0]["delta"]
    assert delta["ci"][0] > 0 and delta["p_holm"] == delta["p"] and delta["family_size"] == 1
    assert _goal(alone, CONTROLS)["holds"] is True
    nulls = {}
    for m in ("ibpo", "sc_grpo", "vineppo", "tempo"):
        nulls[m] = [_run(0.50, None), _run(0.52, None), _run(0.55, None)]
        nulls[f"shuffled:of={m}"] = [_run(0.49, None), _run(0.53, None), _run(0.55, None)]
    family = _results({"grpo": GRPO, "rredcot": method, "shuffled:of=rredcot": control, **nulls})
    delta = next(p["delta"] for p in family["controls"] if p["method"] == "rredcot")
    assert delta["ci"][0] > 0 and delta["family_size"] == 5 and 0.05 < delta["p_holm"] <= 5 * delta["p"] + 1e-12
    assert delta["ci_simultaneous"][0] < 0 < delta["ci"][0]  # the Bonferroni interval at 99% crosses 0
    assert _goal(family, CONTROLS)["holds"] is False


def test_the_report_names_the_family_its_corrections_pay_for():
    rredcot = [_run(0.46, None), _run(0.49, None), _run(0.505, None)]
    results = _results({"grpo": GRPO, "rredcot": rredcot, "ibpo": GRPO, "dapo": GRPO})
    delta = results["methods"]["rredcot"]["delta_vs_grpo"]
    assert delta["family"] == "every method vs GRPO, final accuracy" and delta["family_size"] == 3
    text = report(results)
    assert "corrected for the 3 comparisons with GRPO: Holm-adjusted p" in text
    low, high = delta["ci_simultaneous"]
    assert f"| Holm p {delta['p_holm']:.3f}; [{100 * low:+.1f}, {100 * high:+.1f}] |" in text


def test_the_best_credit_method_must_beat_the_strongest_baseline_not_only_grpo():
    """rredcot +6 to +7 points over GRPO holds against GRPO alone; beside a DAPO that ends 5 points above GRPO it is
    about +1.5 over the strongest baseline, and the goal is judged against DAPO (its tokens too)."""
    rredcot = [_run(0.46, 40_000), _run(0.49, 40_000), _run(0.505, 40_000)]
    alone = _results({"grpo": GRPO, "rredcot": rredcot})
    assert _goal(alone, BEST)["holds"] is True
    assert _goal(alone, BEST)["evidence"].startswith("the only credit method, rredcot: +6.5 [+5.3, +7.7] points (95%);")
    weak_dapo = [_run(0.39, 100_000), _run(0.41, 100_000), _run(0.43, 100_000)]
    assert _goal(_results({"grpo": GRPO, "dapo": weak_dapo, "rredcot": rredcot}), BEST)["holds"] is True
    dapo = [_run(0.45, 100_000), _run(0.47, 100_000), _run(0.49, 100_000)]
    results = _results({"grpo": GRPO, "dapo": dapo, "rredcot": rredcot})
    goal = _goal(results, BEST)
    assert goal["holds"] is False
    assert goal["evidence"].startswith("the strongest baseline is dapo (0.470, GRPO 0.420); the only credit method, "
                                       "rredcot: +1.5")
    assert "reaches dapo's end accuracy on 3/3 seeds, with 0.40x the tokens dapo's curves took" in goal["evidence"]


def test_every_credit_method_is_set_against_a_strongest_baseline_other_than_grpo_as_one_corrected_family():
    dapo = [_run(0.45, 100_000), _run(0.47, 100_000), _run(0.49, 100_000)]
    rredcot = [_run(0.46, 40_000), _run(0.49, 40_000), _run(0.505, 40_000)]
    sc_grpo = [_run(0.44, None), _run(0.45, None), _run(0.50, None)]
    control = [_run(0.40, None), _run(0.41, None), _run(0.42, None)]
    assert _results({"grpo": GRPO, "rredcot": rredcot})["vs_strongest_baseline"] is None  # the main table has it
    results = _results({"grpo": GRPO, "dapo": dapo, "rredcot": rredcot, "sc_grpo": sc_grpo,
                        "shuffled:of=sc_grpo:level=token": control})
    table = results["vs_strongest_baseline"]
    assert table["baseline"] == "dapo" and [row["method"] for row in table["rows"]] == ["rredcot", "sc_grpo"]
    rows = {row["method"]: row["delta"] for row in table["rows"]}
    assert abs(rows["rredcot"]["mean"] - 0.015) < 1e-9 and abs(rows["sc_grpo"]["mean"] - (-0.0067)) < 1e-4
    assert {d["family"] for d in rows.values()} == {"every credit method vs dapo, final accuracy"}
    assert {d["family_size"] for d in rows.values()} == {2}
    p = sorted((rows["rredcot"]["p"], rows["sc_grpo"]["p"]))
    assert sorted(d["p_holm"] for d in rows.values()) == [2 * p[0], max(2 * p[0], p[1])]
    text = report(results)
    assert "## Credit methods against the strongest baseline, dapo" in text
    low, high = rows["rredcot"]["ci_simultaneous"]
    assert (f"| rredcot † | +1.5 [{100 * rows['rredcot']['ci'][0]:+.1f}, {100 * rows['rredcot']['ci'][1]:+.1f}] | "
            f"Holm p {rows['rredcot']['p_holm']:.3f}; [{100 * low:+.1f}, {100 * high:+.1f}] |") in text
