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


def test_report_checks_the_goals_and_can_be_rebuilt(saved_policy, tmp_path):
    from credo.compare import rewrite_report
    out = str(tmp_path / "cmp")
    compare("smoke", out, methods=("sc_grpo",), start=saved_policy, progress=False)
    on_disk = json.load(open(os.path.join(out, "results.json")))
    goals = {g["goal"]: g for g in on_disk["goals"]}
    sc = on_disk["methods"]["sc_grpo"]
    assert goals["SC-GRPO ends above GRPO"]["holds"] == (sc["delta_vs_grpo_mean"] > max(sc["delta_vs_grpo_std"], 1e-9))
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
