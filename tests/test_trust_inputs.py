"""What a command reads, resolved and checked before it claims --out (credo.policy.locate): the valid forms
are accepted, each wrong one is one line naming the field, and the audit's cache key reads every weight file."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from credo.lab.audit.reference import checkpoint_digest
from credo.core.config import ConfigError, UserError
from credo.policy import check_policy_path, check_task_fits, load_policy
from credo.train.starts import resolve_checkpoint
from credo.tasks import make_task
from builders import one_line_error


def test_the_valid_forms_of_a_checkpoint_resolve_to_a_policy_directory(tmp_path, saved_policy, monkeypatch):
    import credo.train.starts as starts
    places = {name: str(tmp_path / name) for name in ("sft-arith", "sft-arith-long", "smollm2")}
    for place in places.values():  # each a policy directory, as the resolved path is checked too
        shutil.copytree(saved_policy, place)
    monkeypatch.setattr(starts, "ensure_sft", lambda progress=True, task="arith": places[f"sft-{task}"])
    monkeypatch.setattr(starts, "ensure_smollm2", lambda: places["smollm2"])
    assert resolve_checkpoint("", "f", task="arith-long") == places["sft-arith-long"]
    assert resolve_checkpoint("sft", "f") == places["sft-arith"]
    assert resolve_checkpoint("smollm2-135m", "f") == places["smollm2"]
    assert resolve_checkpoint(saved_policy, "f") == saved_policy
    run = tmp_path / "run"  # a finished training run: its final/ policy
    shutil.copytree(saved_policy, run / "final")
    (run / "config.yaml").write_text("method: grpo\n")
    assert resolve_checkpoint(str(run), "f") == str(run / "final")
    hf = tmp_path / "hf"  # a Hugging Face model directory needs no policy.json
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    check_policy_path(str(hf), "f")


@pytest.mark.parametrize("files, expect", [
    ({}, "is neither a credo checkpoint"),
    ({"config.yaml": "method: grpo\n"}, "a training run? its policy is"),
    ({"policy.json": '{"backend": "tiny"}'}, "model.safetensors is missing"),
    ({"policy.json": '{"backend": "hf"}'}, "names backend 'hf', which needs a Hugging Face config.json"),
])
def test_a_directory_load_policy_could_not_read_is_refused_naming_the_field(tmp_path, files, expect):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    with pytest.raises(ConfigError) as err:
        check_policy_path(str(folder), "audit.checkpoint")
    assert str(err.value).startswith(f"audit.checkpoint={str(folder)!r}: ") and expect in str(err.value)


@pytest.mark.parametrize("command", [["eval"], ["audit", "--out", "{out}"], ["show", "--out", "{out}"],
                                     ["train", "--out", "{out}", "--start"]])
def test_every_command_refuses_a_tiny_policy_for_a_task_of_words_before_out(tmp_path, capsys, saved_policy, command):
    # its held-out row is digits only, its training rows are words: every prompt is read, not the first few
    data = tmp_path / "mixed.jsonl"
    data.write_text('{"question": "1+2", "answer": "3"}\n'
                    + "".join(f'{{"question": "What is {i} plus 2?", "answer": "{i + 2}"}}\n' for i in range(20)))
    out = tmp_path / "out"
    flag = [] if command[-1] == "--start" else ["--checkpoint"]
    argv = [a.format(out=out) for a in command] + flag + [saved_policy, "--task", f"jsonl:{data}",
                                                          "--set", "task_options.heldout_permille=0"]
    line = one_line_error(capsys, argv)
    assert "this tiny policy cannot read the prompts" in line and "'W'" in line and not out.exists()


def test_force_never_removes_the_run_whose_final_policy_is_the_checkpoint(tmp_path, capsys, saved_policy):
    run = tmp_path / "run"
    shutil.copytree(saved_policy, run / "final")
    (run / "config.yaml").write_text("method: grpo\n")
    for command in ("audit", "show"):
        one_line_error(capsys, [command, "--checkpoint", str(run), "--out", str(run / "final"), "--force"])
        assert (run / "final" / "model.safetensors").is_file()


def test_sft_names_the_start_and_a_damaged_weights_file_is_one_line(tmp_path, capsys, saved_policy):
    out = tmp_path / "out"
    assert "train.start='sft': no such directory" in one_line_error(
        capsys, ["train", "--start", "sft", "--out", str(out)])  # `train` says '' for the SFT start
    damaged = tmp_path / "damaged"
    shutil.copytree(saved_policy, damaged)
    (damaged / "model.safetensors").write_bytes(b"garbage")
    for argv in (["audit", "--checkpoint", str(damaged)], ["show", "--checkpoint", str(damaged)],
                 ["train", "--start", str(damaged)]):
        line = one_line_error(capsys, argv + ["--out", str(out)])
        assert "model.safetensors is not a valid safetensors file" in line and not out.exists()


def test_a_tiny_policy_refuses_a_task_whose_prompts_it_cannot_encode(saved_policy, tmp_path, capsys):
    policy = load_policy(saved_policy)
    check_task_fits(policy, make_task("arith-long"), "train.start")  # its own alphabet: accepted
    data = tmp_path / "words.jsonl"
    data.write_text("".join(f'{{"question": "What is {i} plus 2?", "answer": "{i + 2}"}}\n' for i in range(20)))
    with pytest.raises(ConfigError, match="train.start: this tiny policy cannot read the prompts of task .*'W'"):
        check_task_fits(policy, make_task(f"jsonl:{data}"), "train.start")
    out = tmp_path / "out"  # before, a ValueError traceback at the first sample, with --out already written
    line = one_line_error(capsys, ["train", "--start", saved_policy, "--task", f"jsonl:{data}", "--out", str(out)])
    assert "cannot read the prompts" in line and not out.exists()


def test_the_audit_cache_key_reads_every_shard_of_a_sharded_checkpoint(tmp_path, saved_policy):
    one = checkpoint_digest(saved_policy)
    with open(os.path.join(saved_policy, "model.safetensors"), "rb") as f:  # one file: the key audits were cached by
        assert one == hashlib.sha256(f.read()).hexdigest()[:16]
    shards = tmp_path / "sharded"
    shards.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (shards / name).write_bytes(b"a" * 10)
    (shards / "model.safetensors.index.json").write_text("{}")
    first = checkpoint_digest(str(shards))
    (shards / "model-00002-of-00002.safetensors").write_bytes(b"b" * 10)  # a change in the second shard
    second = checkpoint_digest(str(shards))
    (shards / "model.safetensors.index.json").write_text('{"weight_map": {}}')  # and in the index
    assert len({first, second, checkpoint_digest(str(shards))}) == 3 and len(first) == 16
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no weights"):
        checkpoint_digest(str(tmp_path / "empty"))


def test_a_skipped_jsonl_row_is_reported_once_though_the_task_is_built_again(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\nnot json\n{"question": "2+2", "answer": "4"}\n')
    for _ in range(3):  # a command checks the task before --out, then builds it where it runs
        make_task(f"jsonl:{data}", {"skip_bad_rows": True})
    assert capsys.readouterr().err.count("skipped 1 malformed row(s)") == 1


def test_an_audit_of_baselines_only_writes_its_page(tmp_path, capsys, saved_policy):
    # grpo is a table row, not a credit to colour: the page once failed on an empty list of credits
    from credo.cli.main import main
    out = tmp_path / "audit"
    code = main(["audit", "--checkpoint", saved_policy, "--n", "8", "--group-size", "4", "--k-ref", "2",
                 "--methods", "grpo", "--out", str(out), "--quiet"])
    assert code == 0 and os.path.isfile(out / "audit.html")


def test_compare_refuses_a_start_that_cannot_read_its_task_before_out(tmp_path, capsys, saved_policy):
    out = tmp_path / "cmp"
    line = one_line_error(capsys, ["compare", "--preset", "smoke", "--start", saved_policy, "--task", "gym:chain_sum",
                                   "--out", str(out), "--yes"])
    assert line.startswith("credo compare: error: compare --start: this tiny policy cannot read") and not out.exists()
