import json
import os

from credo.cli.main import main
from credo.core.outputs import run_lock


def _finished(out, name, accuracy, seconds=1.0):
    run = os.path.join(out, "runs", name)
    os.makedirs(run)
    with open(os.path.join(run, "summary.json"), "w") as f:
        json.dump({"step": 10, "tokens_generated": 1500, "seconds": seconds, "final_accuracy": accuracy}, f)


def _part_way(out, name, tokens):
    run = os.path.join(out, "runs", name)
    os.makedirs(run)
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 3, "tokens_generated": tokens}) + "\n")
        f.write('{"step": 4, "tokens_gen')  # a row being written is skipped, not an error


def _snapshot(root):
    return sorted((d, tuple(sorted(fs)), tuple(os.path.getmtime(os.path.join(d, x)) for x in sorted(fs)))
                  for d, _, fs in os.walk(root))


def test_status_shows_each_seed_and_the_paired_difference_so_far_and_writes_nothing(tmp_path, capsys):
    out = str(tmp_path / "cmp")
    for seed, acc in enumerate((0.40, 0.50, 0.45)):
        _finished(out, f"grpo-s{seed}", acc)
    _finished(out, "rredcot-s0", 0.45, seconds=100.0)  # 10 s and 150 tokens a step
    _finished(out, "rredcot-s1", 0.56, seconds=100.0)
    _part_way(out, "rredcot-s2", 750)  # smoke budget 1500 tokens: half-way
    with open(os.path.join(out, "failure-sc_grpo-s0.txt"), "w") as f:
        f.write("Traceback ...\nRuntimeError: boom\n")
    os.makedirs(os.path.join(out, "runs", "dapo-s0"))  # from another plan
    with run_lock(os.path.join(out, "runs", "rredcot-s2")):  # being trained: its log's tokens
        before = _snapshot(out)
        assert main(["compare", "--preset", "smoke", "--methods", "rredcot,sc_grpo", "--seeds", "0,1,2",
                     "--status", "--jobs", "2", "--out", out]) == 0
    text = capsys.readouterr().out
    assert _snapshot(out) == before  # read-only beside a running comparison
    assert "5 of 9 runs finished, 1 part-way, 1 failed, 2 not started" in text
    # rredcot-s2's 750 tokens left = 5 steps x 10 s; sc_grpo has no finished run to cost it; 4 runs left, 2 at once
    assert ("about 25 s of training left at 2 at a time (50 s summed over the runs), from the finished runs' own "
            "clocks, or the part-way ones' (evaluations not counted: the comparison timed none of 8 problems with 2 "
            "at a time); not counting sc_grpo: no step logged yet") in text
    assert "also in runs/, not in this plan (give the run's --methods/--seeds): dapo-s0" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.split()[:1] and line.split()[0] in
            ("grpo", "rredcot", "sc_grpo")}
    assert rows["grpo"][1:5] == ["0.400", "0.500", "0.450", "0.450"]
    # rredcot - grpo on seeds 0 and 1 only: +5 and +6 points, mean +5.5. Their sd (0.7 points) is finer than the
    # smoke preset's 8-problem final evaluation can resolve, so it is floored at one problem, 12.5 points:
    # t(1) = 12.706 -> half-width 12.706 x 12.5 / sqrt(2) = 112.3 (unfloored it would be 6.35: [-0.9, +11.9])
    assert rows["rredcot"][1:] == ["0.450", "0.560", "(50%)", "0.505", "+5.5", "[-106.8,", "+117.8]"]
    assert rows["sc_grpo"][1:] == ["failed", "·", "·", "—", "—"]


def test_status_of_a_directory_without_runs_is_one_line(tmp_path, capsys):
    assert main(["compare", "--preset", "smoke", "--status", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "no runs/ directory" in err and "Traceback" not in err and not os.path.exists(tmp_path / "none")


def test_a_stalled_step_is_left_out_of_the_run_clock_and_the_step_time(tmp_path):
    """A comparison paused with SIGSTOP for 6130 s mid-step: that step's excess over the median is not the
    method's cost (it made dapo-s0 of the long comparison look 5.8x slower than grpo-s0)."""
    from credo.lab.compare.runs import run_result
    from credo.lab.compare.report import run_clocks
    from credo.lab.compare.stats import stalled_seconds
    assert stalled_seconds([5.0, 10.0, 15.0, 6150.0, 6155.0]) == (6130.0, 1)
    assert stalled_seconds([5.0, 15.0, 20.0, 30.0]) == (0.0, 0)  # a 2x step is a step, not a stall
    run = tmp_path / "dapo-s0"
    run.mkdir()
    rows = [{"step": 0, "tokens_generated": 0, "seconds": 0.0, "eval_accuracy": 0.3}]
    rows += [{"step": i, "tokens_generated": 100 * i, "seconds": s}
             for i, s in enumerate((5.0, 10.0, 15.0, 6150.0, 6155.0), 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"step": 5, "tokens_generated": 500, "seconds": 6155.0,
                                                  "final_accuracy": 0.4}))
    result = run_result(str(run))
    assert result["seconds"] == 25.0 and result["seconds_per_step"] == 5.0
    assert (result["stalled_seconds"], result["stalled_steps"]) == (6130.0, 1)
    text = run_clocks({"methods": {"dapo": {"seeds": {"0": result}}}})
    assert text.startswith(" · the runs' own clocks sum to 25 s (leaving out 102 min of 1 stalled step(s)")


def test_a_failed_run_being_retried_is_part_way_and_another_budget_is_refused(tmp_path, capsys, monkeypatch):
    from credo.lab.compare.presets import resolve_preset
    from credo.lab.compare.status import status_text
    out = str(tmp_path / "cmp")
    _finished(out, "grpo-s0", 0.4)
    (tmp_path / "cmp" / "failure-rredcot-s0.txt").write_text("RuntimeError: boom\n")
    os.utime(tmp_path / "cmp" / "failure-rredcot-s0.txt", (1, 1))  # failed long ago; the retry is logging now
    run = tmp_path / "cmp" / "runs" / "rredcot-s0"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "tokens_generated": 100 * i,
                                                           "seconds": 2.0 * i}) + "\n"
                                               for i in (1, 2, 3)))
    with run_lock(str(run)):  # the retry is training
        text = status_text(resolve_preset("smoke", None, None, None, None), out)
    assert "1 of 2 runs finished, 1 part-way, 0 failed" in text and "(20%)" in text
    # no finished rredcot run: costed from the part-way one's 2 s and 100 tokens a step -> 1200 tokens left = 24 s
    assert "about 24 s of training left at 1 at a time" in text and "not counting" not in text
    # stopped: a resume goes on from its newest checkpoint (step 2, 200 tokens), not from its log's last row
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    text = status_text(resolve_preset("smoke", None, None, None, None), out)
    assert "(13%, stopped)" in text and "about 26 s of training left at 1 at a time" in text
    import errno
    import fcntl
    def no_locks(fd, how):  # a file system without locks: whether it runs cannot be told, so it is not "stopped"
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    text = status_text(resolve_preset("smoke", None, None, None, None), out)
    assert "(20%)" in text and "(13%, stopped)" not in text
    from credo.lab.compare.presets import run_config
    from credo.core.config import dump_yaml
    other_budget = resolve_preset("smoke", None, None, 9000, None)
    (tmp_path / "cmp" / "runs" / "grpo-s0" / "config.yaml").write_text(dump_yaml(run_config("grpo", 0, other_budget,
                                                                                            "")))
    assert main(["compare", "--preset", "smoke", "--status", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "runs/grpo-s0 was run with a budget of 9,000 generated tokens, not 1,500" in err and "Traceback" not in err


def test_a_method_with_no_step_logged_is_costed_from_the_step_timed_at_the_start(tmp_path, capsys):
    """The comparison's estimate.json (its timed step per method) costs the methods no run has started."""
    from credo.lab.compare.presets import resolve_preset
    from credo.lab.compare.status import status_text
    out = str(tmp_path / "cmp")
    _finished(out, "grpo-s0", 0.4)  # 1 s over 10 steps of 150 tokens: its own clock, not the timed step
    estimate = {"seconds": 1.0, "jobs": 1, "runs": 2, "eval_seconds": 0.1, "untimed": [],
                "per_method": {"grpo": {"seconds_per_step": 99.0, "tokens_per_step": 1, "run_seconds": 1.0,
                                        "from": "one timed step"},
                               "rredcot": {"seconds_per_step": 3.0, "tokens_per_step": 100, "run_seconds": 1.0,
                                           "from": "one timed step"}}}
    (tmp_path / "cmp" / "estimate.json").write_text(json.dumps(estimate))
    preset = resolve_preset("smoke", ("rredcot", "sc_grpo"), (0, 1), None, None)
    text = status_text(preset, out)
    # grpo-s1 from grpo-s0's own clock (0.1 s a step of 150 tokens: 1 s), not the timed 99 s a token;
    # rredcot: 2 runs x 1500 tokens / 100 a step = 30 steps x 3 s = 90 s; sc_grpo is in neither record
    assert ("about 91 s of training left at 1 at a time (91 s summed over the runs), from the finished runs' own "
            "clocks, or the part-way "
            "ones' (evaluations not counted: the comparison timed none of 8 problems with 1 at a time); from the "
            "estimate made at the comparison's start: rredcot (one timed "
            "step); not counting sc_grpo: no step logged yet") in text
    (tmp_path / "cmp" / "estimate.json").write_text('{"per_method": [1, 2]}')
    assert main(["compare", "--preset", "smoke", "--status", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "estimate.json is not a credo estimate" in err and "Traceback" not in err


def test_a_resume_keeps_the_timed_steps_of_methods_it_did_not_time(tmp_path):
    from credo.lab.compare.eta import estimate, keep_estimate, timed_steps, Timing
    from credo.core.outputs import run_kind
    out = str(tmp_path / "cmp")
    os.makedirs(out)
    first = estimate([("grpo", 100), ("rredcot", 100)], {"grpo": Timing(1.0, 10), "rredcot": Timing(3.0, 10)}, 0.0,
                     eval_every_tokens=50, final_eval_ratio=1.0, jobs=1)
    keep_estimate(out, first)
    assert run_kind(out) == "compare"  # a comparison stopped before any run logged: still its own kind
    again = estimate([("grpo", 100), ("rredcot", 100)], {"grpo": Timing(2.0, 10)}, 0.0,  # rredcot's timing failed
                     eval_every_tokens=50, final_eval_ratio=1.0, jobs=1)
    keep_estimate(out, again)
    kept = timed_steps(out)
    assert kept["grpo"][0] == Timing(2.0, 10) and kept["rredcot"][0] == Timing(3.0, 10)
    assert json.load(open(os.path.join(out, "estimate.json")))["seconds"] == again["seconds"]


def test_status_counts_the_evaluations_and_premise_checks_left_at_the_evaluation_timed_at_the_start(tmp_path):
    """Training from the runs' clocks, plus each unfinished run's curve and final evaluations, the premise checks
    of each run that rests on one and has not had them, and the start's, at estimate.json's evaluation."""
    import dataclasses
    from credo.lab.compare.presets import resolve_preset
    from credo.lab.compare.status import status_text
    out = str(tmp_path / "cmp")
    _finished(out, "grpo-s0", 0.4)  # 1 s over 10 steps of 150 tokens
    _finished(out, "sc_grpo-s0", 0.5, seconds=20.0)  # 2 s a step
    os.makedirs(os.path.join(out, "premises"))
    (tmp_path / "cmp" / "premises" / "sc_grpo-s0.pending").write_text("{}")  # its checks not yet measured
    _part_way(out, "sc_grpo-s1", 750)
    estimate = {"seconds": 1.0, "jobs": 2, "runs": 2, "eval_seconds": 2.0, "eval_n": 8, "untimed": [],
                "per_method": {}}
    (tmp_path / "cmp" / "estimate.json").write_text(json.dumps(estimate))
    preset = dataclasses.replace(resolve_preset("smoke", ("sc_grpo",), (0, 1), None, None), premise_n=4, audit_n=0)
    with run_lock(os.path.join(out, "runs", "sc_grpo-s1")):
        text = status_text(preset, out, jobs=2)
    # training: grpo-s1 10 steps x 0.1 s = 1 s; sc_grpo-s1 750 tokens left = 5 steps x 2 s = 10 s.
    # evaluations at 2 s each (8 problems, the final one 8 too), one per 600 tokens left and one more, and the final:
    # grpo-s1 (1500 left) 3 + 1 = 8 s; sc_grpo-s1 (750 left) 2 + 1 = 6 s, and its checks, 4 completions at 2/8 s
    # = 1 s; sc_grpo-s0's pending checks 1 s; the start's 1 s: 17 s. Two runs left, two at a time: (11 + 17) / 2.
    assert ("about 14 s left at 2 at a time (28 s summed over the runs: 11 s of training, from the finished runs' "
            "own clocks, or the part-way ones'; 17 s of evaluations and premise checks, at 2 s an evaluation of 8 "
            "problems as timed at the comparison's start)") in text
    (tmp_path / "cmp" / "premises" / "start.json").write_text("{}")  # the start's checks measured
    (tmp_path / "cmp" / "premises" / "sc_grpo-s0.pending").unlink()
    with run_lock(os.path.join(out, "runs", "sc_grpo-s1")):
        assert "(26 s summed over the runs: 11 s of training" in status_text(preset, out, jobs=2)
    # an evaluation timed with another number of jobs is another cost: not used
    assert "(evaluations not counted: the comparison timed none of 8 problems with 1 at a time)" in status_text(
        preset, out, jobs=1)
