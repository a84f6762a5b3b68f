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
    for name in ("curves.png", "audit.png"):
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
