import json
import os

from credo.compare import compare


def test_compare_smoke_writes_results_report_and_plots(saved_policy, tmp_path):
    out = str(tmp_path / "cmp")
    results = compare("smoke", out, methods=("rredcot",), start=saved_policy,
                      progress=False)
    on_disk = json.load(open(os.path.join(out, "results.json")))
    assert set(on_disk["methods"]) == {"grpo", "rredcot"}
    for name, entry in on_disk["methods"].items():
        run = entry["seeds"]["0"]
        assert {"curve", "final_accuracy", "tokens_generated", "seconds_per_step", "tokens_to_grpo_final"} <= set(run)
        assert run["tokens_generated"] >= 1500 or run["steps"] >= 1
        assert all({"tokens_generated", "seconds", "accuracy"} <= set(p) for p in run["curve"])
        assert 0 <= entry["final_mean"] <= 1
    assert on_disk["methods"]["grpo"]["step_time_ratio"] == 1.0
    assert "audit" in on_disk and "rredcot" in on_disk["audit"]["methods"]
    report = open(os.path.join(out, "report.md")).read()
    assert "| grpo |" in report and "| rredcot |" in report
    for name in ("curves.png", "curves_by_update.png", "audit.png"):
        assert os.path.getsize(os.path.join(out, name)) > 1000
    assert results["failures"] == {}


def test_a_failing_method_is_reported_and_the_rest_still_runs(saved_policy, tmp_path, monkeypatch):
    import credo.compare as cmp
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
    """A results dict with one 100k-token curve point per seed (at the token count given, or below target)."""
    methods = {}
    for name, values in finals.items():
        seeds = {}
        for i, final in enumerate(values):
            at = reach_at[name][i]
            curve = [{"step": 0, "tokens_generated": 0, "seconds": 0, "accuracy": 0.3}]
            curve.append({"step": 10, "tokens_generated": at or 100_000, "seconds": 1,
                          "accuracy": 0.99 if at else 0.0})
            curve.append({"step": 20, "tokens_generated": 200_000, "seconds": 2, "accuracy": final, "final": True})
            seeds[str(i)] = {"curve": curve, "final_accuracy": final, "seconds_per_step": 0.1, "steps": 20}
        methods[name] = {"seeds": seeds}
    return {"methods": methods, "token_budget": 200_000, "failures": {}}


def test_goal_checks_follow_their_rules():
    from credo.compare import goals, summarise
    results = _synthetic(
        {"grpo": [0.40, 0.42, 0.44], "sc_grpo": [0.43, 0.46, 0.47], "rrpo": [0.41, 0.43, 0.45], "srpo": [0.50, 0.52, 0.51]},
        {"grpo": [100_000, 100_000, 100_000], "sc_grpo": [None, None, None], "rrpo": [None, 150_000, None],
         "srpo": [40_000, 40_000, 40_000]})
    summarise(results)
    checks = {g["goal"]: g["holds"] for g in goals(results)}
    assert checks["SC-GRPO ends above GRPO"] is True          # +3.3 points, paired spread 0.6
    assert checks["SRPO reaches GRPO's final accuracy sooner than RRPO"] is True
    # srpo: +9 points at 0.4x GRPO's tokens on every seed
    assert checks["the best credit method reaches GRPO's final accuracy with <= 0.5x the generated tokens "
                  "and ends >= +5 points above it"] is True
    results["methods"]["sc_grpo"]["seeds"]["1"]["final_accuracy"] = 0.30  # one bad seed: spread swamps the mean
    summarise(results)
    assert {g["goal"]: g["holds"] for g in goals(results)}["SC-GRPO ends above GRPO"] is False
    one_seed = _synthetic({"grpo": [0.40], "sc_grpo": [0.60]}, {"grpo": [100_000], "sc_grpo": [10_000]})
    summarise(one_seed)
    assert all(g["holds"] is None for g in goals(one_seed))   # nothing judged on one seed


def test_report_can_be_rebuilt(saved_policy, tmp_path):
    from credo.compare import rewrite_report
    out = str(tmp_path / "cmp")
    compare("smoke", out, methods=("sc_grpo",), start=saved_policy, progress=False)
    on_disk = json.load(open(os.path.join(out, "results.json")))
    assert [g["holds"] for g in on_disk["goals"]] == [None, None]  # one seed
    os.remove(os.path.join(out, "report.md"))
    rewrite_report(out)
    assert "## Goals" in open(os.path.join(out, "report.md")).read()


def test_a_run_directory_from_another_budget_is_refused_not_mixed_in(saved_policy, tmp_path):
    import pytest
    out = str(tmp_path / "cmp")
    first = compare("smoke", out, methods=("grpo",), start=saved_policy, progress=False)
    again = compare("smoke", out, methods=("grpo",), start=saved_policy, progress=False)  # same config: reused
    assert again["methods"]["grpo"]["seeds"]["0"]["curve"] == first["methods"]["grpo"]["seeds"]["0"]["curve"]
    with pytest.raises(ValueError, match=r"grpo-s0 .*max_generated_tokens: 1500 -> 3000"):
        compare("smoke", out, methods=("grpo",), start=saved_policy, progress=False, token_budget=3000)
