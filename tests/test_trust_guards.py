"""Guards found missing by a trust review: what --force may delete, runs in use, resume against a changed or
damaged run directory, and inputs that used to end in a traceback or a hang instead of one line (exit 2)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from safetensors import SafetensorError

from credo.lab.audit.config import AuditConfig
from credo.cli.main import main
from credo.lab.compare.run import compare, rewrite_report
from credo.lab.compare.presets import resolve_preset
from credo.core.config import ConfigError, UserError, load_config, parse_overrides
from credo.train.evaluate import EvalConfig
from credo.policy import load_policy
from credo.core.outputs import claim_output, is_locked, run_kind, run_lock
from credo.tasks import make_task
from credo.train.trainer import Trainer
from credo.train.plan import load_train_config
from builders import TRUST_FAST_SET, killed_run, one_line_error, snapshot, train_config



# --- what --out may take and what --force may delete ------------------------------------------------------

def test_a_folder_with_run_file_names_and_other_files_is_not_a_run(tmp_path, capsys, saved_policy):
    out = tmp_path / "z"
    out.mkdir()
    (out / "config.yaml").write_text("mine: 1\n")
    (out / "metrics.jsonl").write_text('{"mine": 1}\n')
    (out / "precious.txt").write_text("keep me")
    assert run_kind(str(out)) is None
    before = snapshot(str(out))
    line = one_line_error(capsys, ["train", "--steps", "1", "--start", saved_policy, "--out", str(out), "--quiet"])
    assert "not a credo output directory" in line and "nothing was touched" in line
    assert snapshot(str(out)) == before
    os.remove(out / "precious.txt")  # the same two names alone: an old run directory from before the marker
    assert run_kind(str(out)) == "train"


def test_a_run_before_its_first_checkpoint_is_replaced_only_when_it_holds_nothing_else(tmp_path, capsys, saved_policy):
    out = tmp_path / "run"
    trainer = Trainer(train_config(saved_policy), str(out), progress=False)
    trainer.train(stop_after=1)  # step 1 of checkpoint_every=2: no checkpoint yet
    assert not (out / "checkpoints").exists()
    (out / "notes.txt").write_text("mine")
    before = snapshot(str(out))
    line = one_line_error(capsys,
                          ["train", "--steps", "1", "--start", saved_policy, "--out", str(out),
                           "--quiet", *TRUST_FAST_SET])
    assert "files credo did not write" in line
    assert snapshot(str(out)) == before
    os.remove(out / "notes.txt")
    with run_lock(str(out)):  # another process training it
        line = one_line_error(capsys, ["train", "--steps", "1", "--start", saved_policy, "--out", str(out), "--quiet",
                                       *TRUST_FAST_SET])
        assert "another credo process" in line
    assert main(["train", "--steps", "1", "--start", saved_policy, "--out", str(out), "--quiet", *TRUST_FAST_SET]) == 0


@pytest.mark.parametrize("where", ["same", "inside"])
def test_force_never_deletes_the_commands_own_input(tmp_path, capsys, saved_policy, where):
    checkpoint = saved_policy if where == "same" else str(tmp_path)  # tmp_path holds the start
    before = snapshot(saved_policy)
    line = one_line_error(capsys, ["audit", "--checkpoint", saved_policy, "--out", checkpoint, "--force", "--n", "4",
                                   "--group-size", "2", "--k-ref", "2", "--quiet"])
    assert f"the input {saved_policy}" in line and "nothing was touched" in line
    assert snapshot(saved_policy) == before


def test_force_never_deletes_the_current_directory_or_a_locked_run(tmp_path, monkeypatch):
    out = tmp_path / "here"
    out.mkdir()
    (out / ".credo-kind").write_text("audit\n")  # credo's own output (--force replaces nothing else)
    (out / "audit.json").write_text("x")
    monkeypatch.chdir(out)
    with pytest.raises(UserError, match="the current directory"):
        claim_output(".", "audit", force=True)
    monkeypatch.chdir(tmp_path)
    with run_lock(str(out)):
        assert is_locked(str(out))
        with pytest.raises(UserError, match="another credo process"):
            claim_output(str(out), "audit", force=True)
        with pytest.raises(UserError, match="another credo process"):
            with run_lock(str(out)):
                pass
    assert not is_locked(str(out))
    import fcntl
    import threading
    from credo.core.outputs import RUN_LOCK, lock_held
    probe = os.open(out / RUN_LOCK, os.O_RDWR)  # `compare --status` testing the lock as a trainer starts
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    threading.Timer(0.2, os.close, [probe]).start()
    with run_lock(str(out)):  # waits the probe out rather than refusing
        assert lock_held(str(out)) is True
    assert lock_held(str(out)) is False
    assert (out / "audit.json").read_text() == "x"
    claim_output(str(out), "audit", force=True)
    assert not (out / "audit.json").exists()


# --- resume verifies the run directory ------------------------------------------------------------------

def test_resume_refuses_a_config_yaml_changed_since_the_checkpoint(tmp_path, capsys, saved_policy):
    run = str(tmp_path / "run")
    killed_run(saved_policy, run)
    path = os.path.join(run, "config.yaml")
    data = yaml.safe_load(open(path))
    data["lr"] = 0.5
    open(path, "w").write(yaml.safe_dump(data, sort_keys=False))
    line = one_line_error(capsys, ["train", "--resume", run, "--quiet"])
    assert "train.lr: checkpoint 0.001, now 0.5" in line


def test_resume_with_more_steps_rewrites_config_yaml_and_fewer_is_refused(tmp_path, capsys, saved_policy):
    run = str(tmp_path / "run")
    killed_run(saved_policy, run)  # steps=4, checkpoint at step 2
    assert main(["train", "--resume", run, "--steps", "5", "--quiet"]) == 0
    assert yaml.safe_load(open(os.path.join(run, "config.yaml")))["steps"] == 5
    assert json.load(open(os.path.join(run, "summary.json")))["step"] == 5
    line = one_line_error(capsys, ["train", "--resume", run, "--steps", "3", "--quiet"])
    assert "train.steps=3 is below the 5 steps the run was trained towards (its last checkpoint is at step 4)" in line
    line = one_line_error(capsys, ["train", "--resume", run, "--steps", "0", "--quiet"])
    assert "train.steps must be > 0, got 0" in line


def test_resume_refuses_a_metrics_log_cut_short(tmp_path, capsys, saved_policy):
    run = str(tmp_path / "run")
    killed_run(saved_policy, run)  # rows for steps 0..3, checkpoint at step 2
    path = os.path.join(run, "metrics.jsonl")
    rows = open(path).read().splitlines()
    open(path, "w").write(rows[0] + "\n")  # only step 0 left
    line = one_line_error(capsys, ["train", "--resume", run, "--quiet"])
    assert "ends at step 0 but the checkpoint is at step 2" in line
    assert open(path).read() == rows[0] + "\n"


def test_a_data_parallel_rank_that_does_not_write_still_refuses_a_log_cut_short(tmp_path):
    """Only the main rank writes metrics.jsonl; the others must make the resume check too, or they would wait
    at their first collective for a main rank that already stopped."""
    from credo.core.files import NullLog
    path = tmp_path / "metrics.jsonl"
    text = "".join(json.dumps({"step": k}) + "\n" for k in range(3))
    path.write_text(text)
    NullLog(str(path)).truncate_after(2, must_reach=True)  # holds step 2: passes
    with pytest.raises(UserError, match="ends at step 2 but the checkpoint is at step 4"):
        NullLog(str(path)).truncate_after(4, must_reach=True)
    NullLog(str(path)).truncate_after(0)  # a non-main rank never writes
    assert path.read_text() == text


@pytest.mark.parametrize("finished", [True, False])
def test_resume_refuses_a_run_whose_checkpoints_were_removed(tmp_path, capsys, saved_policy, finished):
    import shutil
    run = str(tmp_path / "run")
    if finished:
        assert main(["train", "--method", "grpo", "--steps", "4", "--start", saved_policy, "--out", run, "--quiet",
                     *TRUST_FAST_SET]) == 0
    else:
        killed_run(saved_policy, run, stop_after=3)  # logged step 3, past the checkpoint of step 2
    shutil.rmtree(os.path.join(run, "checkpoints"))
    before = snapshot(run)
    line = one_line_error(capsys, ["train", "--resume", run, "--quiet"])
    assert "nothing to resume from" in line
    assert snapshot(run) == before


# --- one line instead of a traceback or a hang -----------------------------------------------------------

@pytest.mark.parametrize("override, expect", [
    ("lr=[", "--set lr: '[' is not valid YAML"),
    ("lr=" + "9" * 400, "train.lr must be a number"),
    ("seed=99999999999999999999999", "train.seed must be in 0..4294967295"),
    ("seed=-1", "train.seed must be in 0..4294967295"),
    ("credit=5", "train.credit must be a mapping"),
    ("lora.target_modules=5", "train.lora.target_modules must be a list"),
    ("lora.target_modules={a: 1}", "train.lora.target_modules must be a list"),
    ("task_options=5", "train.task_options must be a mapping"),
    ("eval_n=0", "train.eval_n must be > 0, got 0"),
    # a typo's extra digits: one line, not an allocation that fails with a traceback or a list built for hours
    ("group_size=1000000000", "train.group_size must be in 2..1,024, got 1000000000"),
    ("prompts_per_step=100000", "train.prompts_per_step x train.group_size must be <= 65,536 completions a step"),
    ("eval_n=1000000000000", "train.eval_n must be in 1..100,000"),
    ("final_eval_n=1000000000000", "train.final_eval_n must be in 0..100,000"),
    ("epochs=1000000", "train.epochs must be in 1..100"),
    ("dynamic_max_rounds=1000000000", "train.dynamic_max_rounds must be in 1..100"),
])
def test_bad_overrides_name_their_field(override, expect):
    with pytest.raises(ConfigError) as err:
        load_train_config(None, [override])
    assert expect in str(err.value)


@pytest.mark.parametrize("overrides, expect", [
    (["sampling.max_new_tokens=100000000"], "train.sampling.max_new_tokens must be in 1..32,768"),
    (["lora.r=100000"], "train.lora.r must be in 0..4,096"),
    (["method=vineppo", "credit.k=1000000000"], "train.credit.k must be in 1..1,024"),
    (["method=srpo", "reset.n_fresh=100000"], "train.reset.n_fresh must be in 2..1,024"),
    (["method=srpo", "reset.max_fresh_attempts=1000000000"], "train.reset.max_fresh_attempts must be in 1..65,536"),
    (["method=srpo", "reset.n_reset=100000"], "train.reset.n_reset must be in 2..1,024"),
    (["method=spo_chain", "credit.k=1000000000"], "train.credit.k must be in 1..1,024"),
    (["method=vineppo", "credit.batch_size=1000000000"], "train.credit.batch_size must be in 1..65,536"),
])
def test_the_sizes_of_generation_estimators_and_resets_have_upper_bounds(overrides, expect):
    with pytest.raises(ConfigError) as err:
        load_train_config(None, overrides)
    assert expect in str(err.value)


@pytest.mark.parametrize("argv, expect", [
    (["--schedule", "1000000x1"], "compare.epochs (--schedule EPOCHSxMINIBATCHES) must be in 1..100"),
    (["--schedule", "1x1000000"], "compare.minibatches (--schedule EPOCHSxMINIBATCHES) must be in 1..65,536"),
    (["--jobs", "100000"], "compare --jobs must be in 1..256"),
    (["--set", "audit_n=2"], "compare.audit_n must be 0 (no audit) or in 4..100,000, got 2"),
    (["--set", "premise_n=-1"], "compare.premise_n must be in 0..100,000 (0: no premise checks), got -1"),
])
def test_compare_names_its_own_flag_when_a_schedule_or_jobs_is_out_of_range(tmp_path, capsys, argv, expect):
    out = tmp_path / "cmp"  # a start that does not exist: were the bound gone, it still stops at once
    assert expect in one_line_error(capsys, ["compare", "--preset", "smoke", *argv, "--start", str(tmp_path / "none"),
                                             "--out", str(out), "--yes"])
    assert not out.exists()


def test_parse_overrides_keeps_valid_yaml_values():
    assert parse_overrides(["a.b=[1, 2]", "c=0.5"]) == {"a": {"b": [1, 2]}, "c": 0.5}


@pytest.mark.parametrize("content, expect", [
    ("{bad", "is not valid JSON"),
    ("[1]", "must hold a JSON object"),
    ('{"backend": "tiny"}', "cannot load the checkpoint (KeyError"),
])
def test_corrupt_policy_json_is_one_line(saved_policy, content, expect):
    with open(os.path.join(saved_policy, "policy.json"), "w") as f:
        f.write(content)
    with pytest.raises(UserError) as err:
        load_policy(saved_policy)
    assert expect in str(err.value) and saved_policy in str(err.value)


@pytest.mark.parametrize("content, expect", [("{bad", "is not valid JSON"), ("{}", "no 'methods' mapping"),
                                             ('{"methods": {"grpo": {"seeds": {}}}}', "lacks the field")])
def test_report_only_on_a_damaged_results_json(tmp_path, content, expect):
    (tmp_path / "results.json").write_text(content)
    with pytest.raises(UserError, match=expect):
        rewrite_report(str(tmp_path))


@pytest.mark.parametrize("override, expect", [
    ("batch_size=0", "audit.batch_size must be >= 1"), ("temperature=0", "audit.temperature must be > 0"),
    ("max_new_tokens=0", "audit.max_new_tokens must be in 1..4096"), ("segmenter=bogus", "audit.segmenter must be"),
    ("n=1000000000", "audit.n must be in 2..100,000"), ("k_ref=1000000000", "audit.k_ref must be in 2..1,024"),
    ("group_size=100000", "audit.group_size must be in 2..1,024"),
])
def test_audit_numbers_are_range_checked(override, expect):
    with pytest.raises(ConfigError, match=expect):
        load_config(AuditConfig, None, [override], prefix="audit.")


def test_a_small_problem_space_ends_the_held_out_list_instead_of_hanging():
    task = make_task("arith", {"digits": 1, "min_terms": 2, "max_terms": 2, "ops": "+", "heldout_permille": 50})
    held = task.heldout_problems(10_000)  # 100 distinct problems, about 5 of them held out
    assert 0 < len(held) < 100 and len({p.key for p in held}) == len(held)
    assert task.heldout_problems(10_000) == held  # the exhausted list is kept, not searched again


def test_task_option_errors_name_the_users_key(capsys):
    line = one_line_error(capsys, ["eval", "--set", "task_options.digits=0", "--quiet"])
    assert "eval.task_options.digits must be in 1..4" in line
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(EvalConfig, None, ["task_options=5"], prefix="eval.")


@pytest.mark.parametrize("seeds, methods, expect", [((0, 0), None, "names a seed twice"),
                                                    ((0,), ("rredcot", "rredcot"), "share one run directory"),
                                                    ((-1,), None, "must be in 0..")])
def test_compare_refuses_duplicate_runs(seeds, methods, expect):
    with pytest.raises(ConfigError, match=expect):
        resolve_preset("smoke", methods, seeds, None, None)


def test_sft_eval_n_is_range_checked(tmp_path, capsys):
    line = one_line_error(capsys, ["sft", "--eval-n", "-5", "--out", str(tmp_path / "s"), "--quiet"])
    assert "sft --eval-n must be in 1..100,000, got -5" in line
    line = one_line_error(capsys, ["sft", "--eval-n", "1000000000000", "--out", str(tmp_path / "s"), "--quiet"])
    assert "sft --eval-n must be in 1..100,000, got 1000000000000" in line
    assert not (tmp_path / "s").exists()
    for flag, value, expect in (("--n", "1000000000000", "eval --n must be in 1..100,000"),
                                ("--k", "100000000", "eval --k must be in 0..1,024"),
                                ("--max-new-tokens", "100000000", "eval --max-new-tokens must be in 1..32,768")):
        assert expect in one_line_error(capsys, ["eval", flag, value, "--quiet"])


def test_a_file_system_without_locks_trains_unlocked_with_a_warning(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    run = str(tmp_path / "run")
    with pytest.warns(UserWarning, match="gives no lock"):
        with run_lock(run):
            assert not is_locked(run)
    claim_output(run, "train", force=True)  # no lock to ask for: replaced as before locks existed


def test_a_readme_or_desktop_file_beside_an_old_output_does_not_hide_it_but_is_never_deleted(tmp_path, capsys,
                                                                                             saved_policy):
    out = tmp_path / "run"
    killed_run(saved_policy, str(out), stop_after=1)  # no checkpoint yet
    os.remove(out / ".credo-kind")  # as written before the marker existed
    (out / ".DS_Store").write_text("")
    assert run_kind(str(out)) == "train"
    (out / "README.md").write_text("how I made this")
    assert run_kind(str(out)) == "train"  # still recognised...
    line = one_line_error(capsys,
                          ["train", "--steps", "1", "--start", saved_policy, "--out", str(out),
                           "--quiet", *TRUST_FAST_SET])
    assert "files credo did not write" in line  # ...but not replaced with the README in it
    assert (out / "README.md").read_text() == "how I made this"


def test_a_new_run_into_a_run_whose_checkpoints_were_removed_is_refused(tmp_path, capsys, saved_policy):
    import shutil
    run = str(tmp_path / "run")
    killed_run(saved_policy, run, stop_after=3)  # logged step 3, past the checkpoint of step 2
    shutil.rmtree(os.path.join(run, "checkpoints"))
    before = snapshot(run)
    line = one_line_error(capsys,
                          ["train", "--steps", "4", "--start", saved_policy, "--out", run, "--quiet", *TRUST_FAST_SET])
    assert "nothing to resume from" in line
    assert snapshot(run) == before


def test_resume_may_change_what_does_not_change_training_but_never_shorten_it(tmp_path, capsys, saved_policy):
    run = str(tmp_path / "run")
    killed_run(saved_policy, run, "steps=6", stop_after=3)  # trained towards 6 steps, checkpoint at step 2
    path = os.path.join(run, "config.yaml")
    data = yaml.safe_load(open(path))
    data["keep_checkpoints"], data["final_eval_n"] = 1, 2
    open(path, "w").write(yaml.safe_dump(data, sort_keys=False))
    line = one_line_error(capsys, ["train", "--resume", run, "--steps", "5", "--quiet"])
    assert "train.steps=5 is below the 6 steps the run was trained towards" in line
    assert main(["train", "--resume", run, "--quiet"]) == 0
    assert json.load(open(os.path.join(run, "summary.json")))["final_eval_n"] == 2
    assert len(os.listdir(os.path.join(run, "checkpoints"))) == 1


def test_a_zero_head_count_is_named_not_divided_by():
    from credo.train.sft_config import SFTConfig
    with pytest.raises(ConfigError, match="sft.model.n_head must be positive, got 0"):
        load_config(SFTConfig, None, ["model.n_head=0"], prefix="sft.")


# --- a full disk or a read-only file system ---------------------------------------------------------------

def _fake_comparison(out):
    run = out / "runs" / "grpo-s0"
    run.mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl", "summary.json"):
        (run / name).write_text("{}\n")


@pytest.mark.parametrize("error, expect", [
    # a copy's error names its source first and its destination second: the destination is where it failed
    (OSError(28, "No space left on device", "/data/src", None, "/full/dst"),
     "No space left on device: /full/dst; free space there, then rerun"),
    (OSError(30, "Read-only file system", "/mnt/ro/x"), "Read-only file system: /mnt/ro/x; make it writable, or "
                                                        "write elsewhere, then rerun"),
    # no file named by the error: the run directory being written
    (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
     "b/runs/grpo-s0; free space there, then rerun"),
])
def test_a_full_or_read_only_disk_is_one_line_and_leaves_nothing_half_written(tmp_path, capsys, monkeypatch,
                                                                               error, expect):
    import credo.lab.compare.export as compare_export
    _fake_comparison(tmp_path / "a")

    def fail(*_):
        raise error
    monkeypatch.setattr(compare_export.shutil, "copyfile", fail)
    line = one_line_error(capsys, ["compare", "--out", str(tmp_path / "a"), "--export", str(tmp_path / "b")])
    assert expect in line
    assert not os.path.exists(tmp_path / "b" / "runs" / "grpo-s0")
    assert not [p for p in (tmp_path / "b" / "runs").iterdir()]  # no temporary directory left behind


def test_another_os_error_is_not_dressed_as_a_user_error(tmp_path, monkeypatch):
    import credo.lab.compare.export as compare_export
    _fake_comparison(tmp_path / "a")

    def fail(*_):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(compare_export.shutil, "copyfile", fail)
    with pytest.raises(OSError, match="Input/output error"):
        main(["compare", "--out", str(tmp_path / "a"), "--export", str(tmp_path / "b")])


def test_a_full_disk_mid_training_says_how_to_resume(tmp_path, capsys, saved_policy, monkeypatch):
    """safetensors reports a full disk as a SafetensorError (errno only in its text): still one line, with the
    run's way on from its last good checkpoint."""
    import credo.policy.tiny as tiny
    real, calls = tiny.save_file, []

    def full_on_the_second_checkpoint(state, path):
        calls.append(path)
        if len(calls) == 2:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        real(state, path)
    monkeypatch.setattr(tiny, "save_file", full_on_the_second_checkpoint)
    out = str(tmp_path / "run")
    line = one_line_error(capsys,
                          ["train", "--method", "grpo", "--start", saved_policy, "--steps", "4",
                           "--out", out, "--quiet",
                                   *TRUST_FAST_SET])
    assert f"No space left on device: {out}/checkpoints/step-000004; free space there (once fixed, continue with " \
           f"--resume {out}" in line
    assert os.listdir(os.path.join(out, "checkpoints")) == ["step-000002"]  # the last good one, whole


def test_a_full_disk_stops_a_comparison_instead_of_failing_every_method(tmp_path, saved_policy, monkeypatch):
    import pickle
    import credo.lab.compare.grid as cmp
    from credo.core.disk_errors import DiskError
    tried = []

    def full(method, *args, **kwargs):
        tried.append(method)
        raise OSError(28, "No space left on device", "/full/runs/x/metrics.jsonl")
    monkeypatch.setattr(cmp, "run_one", full)
    with pytest.raises(DiskError, match="No space left on device: /full/runs/x/metrics.jsonl"):
        compare("smoke", str(tmp_path / "cmp"), methods=("rloo",), start=saved_policy, progress=False)
    assert tried == ["grpo"]  # rloo was not tried, so not reported as a failure of its own
    assert not [f for f in os.listdir(tmp_path / "cmp") if f.startswith("failure-")]
    # a worker process (--jobs 2) raises it to the parent as a DiskError, which crosses the process boundary
    monkeypatch.setattr(cmp, "run_one", lambda *a: (_ for _ in ()).throw(
        SafetensorError("Error while serializing: I/O error: Read-only file system (os error 30)")))
    with pytest.raises(DiskError) as raised:
        cmp._worker("grpo", 0, resolve_preset("smoke", None, None, None, None), saved_policy, str(tmp_path / "w"), 1)
    assert "Read-only file system" in str(pickle.loads(pickle.dumps(raised.value)))


def test_a_short_or_failed_write_names_the_file_python_does_not(tmp_path, monkeypatch):
    """Python names a file when open() fails, never when write() does: credo's write primitives add it."""
    from credo.core import files as runs
    from credo.core.disk_errors import DiskError
    log = runs.MetricsLog(str(tmp_path / "metrics.jsonl"))
    log.append({"step": 1})
    monkeypatch.setattr(runs.os, "write", lambda fd, data: len(data) // 2)  # a full disk takes half the row
    with pytest.raises(DiskError, match=f"No space left on device: {tmp_path / 'metrics.jsonl'}; free space there"):
        log.append({"step": 2})
    monkeypatch.undo()

    def fails(*_):
        raise OSError(122, "Disk quota exceeded")  # what a failed write() raises: no filename
    monkeypatch.setattr(runs.shutil, "copyfile", fails)
    with pytest.raises(DiskError, match=f"Disk quota exceeded: {tmp_path / 'copy'}; free space within your quota"):
        runs.atomic_copy(str(tmp_path / "metrics.jsonl"), str(tmp_path / "copy"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_user_error_quoting_os_error_text_is_not_a_full_disk():
    from credo.core.disk_errors import DiskError, as_disk_error, is_disk_error
    assert not is_disk_error(ConfigError("row 3: 'copy failed (os error 28)' is not a number"))
    assert not is_disk_error(OSError(5, "Input/output error"))
    assert is_disk_error(SafetensorError("I/O error: Disk quota exceeded (os error 122)"))
    named = as_disk_error(SafetensorError('Read-only file system (os error 30) at path "/ro/run/.tmpAB12"'))
    assert str(named) == "Read-only file system: /ro/run; make it writable, or write elsewhere, then rerun"
    assert isinstance(named, DiskError) and str(named.with_then(" (resume)")).endswith("elsewhere (resume)")


def test_a_full_disk_in_a_parallel_comparison_starts_no_further_run(tmp_path, saved_policy, monkeypatch, capsys):
    """A process pool starts what it is handed ahead of time: runs are handed over one per free worker, so no
    run begins after the refused write; the one already going is waited for."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    import credo.lab.compare.grid as cmp
    from credo.core.disk_errors import DiskError
    submitted = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            submitted.append(args[2:4])  # run_announced(index, _worker, method, seed, ...)
            return super().submit(fn, *args, **kwargs)

    def worker(method, seed, *_):
        if (method, seed) == ("grpo", 0):
            raise DiskError("No space left on device: /full/runs/grpo-s0")
        time.sleep(0.5)
        return {"final_accuracy": 0.5}, None
    monkeypatch.setattr(cmp, "_executor", lambda jobs, workers: Counting(max_workers=jobs))
    monkeypatch.setattr(cmp, "_worker", worker)
    preset = resolve_preset("smoke", ("rloo",), (0, 1, 2), None, None)
    plan = [(m, s, str(tmp_path / f"{m}-{s}")) for s in preset.seeds for m in preset.methods]
    with pytest.raises(DiskError, match="/full/runs/grpo-s0"):
        cmp._run_parallel(plan, preset, saved_policy, cmp.tqdm(disable=True), jobs=2)
    assert submitted == [("grpo", 0), ("rloo", 0)]
    assert "stopping on a refused write; waiting for 1 running run(s)" in capsys.readouterr().err


def test_with_until_workers_are_handed_the_runs_that_fit_first_and_results_come_back_in_plan_order(
        tmp_path, saved_policy, monkeypatch):
    import time
    from concurrent.futures import ThreadPoolExecutor
    import credo.lab.compare.grid as cmp
    submitted = []

    class Counting(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            submitted.append(args[2:4])  # run_announced(index, _worker, method, seed, ...)
            return super().submit(fn, *args, **kwargs)
    monkeypatch.setattr(cmp, "_executor", lambda jobs, workers: Counting(max_workers=jobs))
    monkeypatch.setattr(cmp, "_worker", lambda method, seed, *_: ({"seed": seed}, None))
    preset = resolve_preset("smoke", ("grpo",), (0, 1, 2), None, None)
    plan = [("grpo", s, str(tmp_path / f"grpo-{s}")) for s in preset.seeds]
    outcomes = cmp._run_parallel(plan, preset, saved_policy, cmp.tqdm(disable=True), jobs=2,
                                 seconds=[5000.0, 100.0, 0.0], until=time.time() + 300)
    assert submitted == [("grpo", 1), ("grpo", 2), ("grpo", 0)]
    assert [result["seed"] for result, _ in outcomes] == [0, 1, 2]


def test_a_broken_worker_pool_stops_the_comparison_and_fails_no_run(tmp_path, saved_policy, monkeypatch):
    """A worker killed (out of memory) breaks a process pool: the comparison stops in one line once the runs
    going are done, and the runs not yet handed over are not recorded as failed (a rerun trains them)."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    import credo.lab.compare.grid as cmp

    class BreaksAfterTwo(ThreadPoolExecutor):
        handed = 0

        def submit(self, fn, *args, **kwargs):
            BreaksAfterTwo.handed += 1
            if BreaksAfterTwo.handed > 2:
                raise BrokenProcessPool("A process in the process pool was terminated abruptly")
            return super().submit(fn, *args, **kwargs)
    monkeypatch.setattr(cmp, "_executor", lambda jobs, workers: BreaksAfterTwo(max_workers=jobs))
    monkeypatch.setattr(cmp, "_worker", lambda method, seed, *_: ({"final_accuracy": 0.5, "seed": seed}, None))
    preset = resolve_preset("smoke", ("rloo",), (0, 1, 2), None, None)
    plan = [(m, s, str(tmp_path / f"{m}-{s}")) for s in preset.seeds for m in preset.methods]
    with pytest.raises(UserError, match=r"^a worker process, between runs, was stopped by an unknown cause .*; no "
                                        r"run failed: .*rerun the same command to go on"):
        cmp._run_parallel(plan, preset, saved_policy, cmp.tqdm(disable=True), jobs=2)
    assert BreaksAfterTwo.handed == 3  # nothing handed over after the pool broke


@pytest.mark.parametrize("which, override, expect", [
    ("tiny", "batch_size=100000000", "sft.batch_size must be in 1..65,536"),
    ("hf", "batch_size=100000000", "sft.batch_size must be in 1..65,536"),
    ("hf", "max_new_tokens=100000000", "sft.max_new_tokens must be in 1..32,768"),
    ("hf", "lora.r=100000", "sft.lora.r must be in 0..4,096"),
])
def test_sft_sizes_have_upper_bounds(which, override, expect):
    from credo.train.sft_config import SFTConfig
    from credo.train.sft_hf import HFSFTConfig
    with pytest.raises(ConfigError, match=expect):
        load_config(SFTConfig if which == "tiny" else HFSFTConfig, None, [override], prefix="sft.")


def test_sft_snapshots_refuses_a_file_or_a_non_empty_directory_for_either_model(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine").write_text("someone's")
    for where in ("file", "full"):
        for model in (["--task", "arith"], ["--start", "smollm2-135m", "--task", "gym:chain_sum"]):
            line = one_line_error(capsys, ["sft", *model, "--out", str(tmp_path / "s"), "--quiet",
                                           "--snapshots", str(tmp_path / where)])
            assert f"sft --snapshots {tmp_path / where}: not a new or empty directory" in line
    assert not (tmp_path / "s").exists() and (tmp_path / "full" / "mine").read_text() == "someone's"
    for snapshots, out in ((tmp_path / "s" / "snap", tmp_path / "s"), (tmp_path / "t", tmp_path / "t" / "out")):
        line = one_line_error(capsys, ["sft", "--start", "smollm2-135m", "--task", "gym:chain_sum", "--quiet",
                                       "--out", str(out), "--snapshots", str(snapshots)])
        assert f"sft --snapshots {snapshots}: inside --out {out} or holding it" in line and not out.exists()
