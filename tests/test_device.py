"""The `device` / `dtype` settings: their checks, `auto`, and every tensor of a step on the chosen device.

Where a GPU is needed, CUDA is emulated on the CPU (tests/fake_cuda.py): tensors put on 'cuda' are marked, and
an op that mixes them with CPU tensors raises as CUDA would, so a tensor built on the CPU by mistake fails here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings

import pytest
import torch
import yaml

from conftest import tiny_policy
from fake_cuda import FakeCuda
from builders import build_tokenizer, tiny_llama

from credo.lab.audit.config import AuditConfig
from credo.lab.audit.reference import checkpoint_digest, reference_key
from credo.cli.main import main
from credo.lab.compare.run import jobs_on
from credo.core.config import ConfigError, to_dict
from credo.policy import load_policy
from credo.core.protocols import SamplingConfig
from credo.policy.device import device_name, resolve_device, resolve_dtype
from credo.policy.hf import HFPolicy
from credo.train.trainer import Trainer
from credo.train.config import config_from_run
from credo.train.plan import load_train_config

COMMANDS = ("train", "sft", "eval", "audit", "compare", "show")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("value", ["cuda:x", "gpu", "cuda:01", "cuda:-1", "CPU", "3"])
def test_a_device_setting_that_is_no_device_is_one_line_naming_the_field(command, value, capsys):
    prefix = "eval" if command == "eval" else command
    assert main([command, "--set", f"device={value}", "--help-config"]) == 2
    assert f"{prefix}.device" in _stderr_line(capsys)


@pytest.mark.parametrize("command", ["train", "eval", "audit", "compare", "show"])
def test_a_dtype_the_cpu_cannot_run_is_one_line_naming_the_field(command, capsys):
    assert main([command, "--set", "device=cpu", "--set", "dtype=bfloat16", "--help-config"]) == 2
    assert f"{command}.dtype=bfloat16 needs a GPU" in _stderr_line(capsys)
    assert main([command, "--set", "dtype=float16", "--help-config"]) == 2
    assert f"{command}.dtype must be one of float32, bfloat16" in _stderr_line(capsys)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_lists_device_and_takes_the_flag(command, capsys):
    assert main([command, "--device", "cpu", "--help-config"] + (["--start", "smollm2-135m"] if command == "sft"
                                                                    else [])) == 0
    listed = capsys.readouterr().out
    assert 'device = "cpu"' in listed and 'dtype = "float32"' in listed


def test_auto_is_cuda_exactly_when_torch_says_it_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_dtype("bfloat16", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ConfigError, match=r"audit.device=cuda:2: this machine has 2 CUDA device\(s\), cuda:0..cuda:1"):
        resolve_device("cuda:2", "audit.device")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="train.dtype=bfloat16 needs a GPU"):
        resolve_dtype("bfloat16", resolve_device("auto"), "train.dtype")


def _command_line(command: str, tmp_path, start: str) -> list[str]:
    return {"train": ["train", "--steps", "1", "--start", start],
            "sft": ["sft", "--eval-n", "4"],
            "eval": ["eval", "--checkpoint", start, "--n", "4"],
            "audit": ["audit", "--checkpoint", start, "--n", "4", "--group-size", "2", "--k-ref", "2"],
            "compare": ["compare", "--preset", "smoke", "--start", start, "--yes"],
            "show": ["show", "--checkpoint", start, "--n", "1"]}[command] + (
        [] if command == "eval" else ["--out", str(tmp_path / "out")])


@no_cuda
@pytest.mark.parametrize("command", COMMANDS)
def test_cuda_on_a_machine_without_cuda_is_one_line_exit_2_and_touches_no_output(command, tmp_path, saved_policy,
                                                                                   capsys):
    assert main(_command_line(command, tmp_path, saved_policy) + ["--device", "cuda", "--quiet"]) == 2
    line = _stderr_line(capsys)
    assert f"credo {command}: error: {command}.device=cuda: this machine has no CUDA device" in line
    assert not (tmp_path / "out").exists()


class _Reached(Exception):
    """Raised by the load_policy spy: the command got as far as placing its model."""


@pytest.mark.parametrize("command,where",
                         [("train", "credo.train.step.load_policy"), ("eval", "credo.policy.load_policy"),
                                           ("audit", "credo.lab.audit.reference.load_policy"),
                                           ("show", "credo.lab.show.view.load_policy"),
                                           ("sft", "credo.policy.load_policy")])
@pytest.mark.parametrize("flag", [[], ["--device", "cuda:1"]])
def test_each_command_places_its_model_on_the_device_auto_or_named(command, where, flag, tmp_path, saved_policy,
                                                                   monkeypatch):
    """With torch saying CUDA is there, `auto` (no flag) and `--device cuda:1` both reach load_policy."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    placed = []

    def spy(path, device="cpu", *args, **kwargs):
        placed.append((torch.device(device), kwargs.get("dtype", torch.float32)))
        raise _Reached

    monkeypatch.setattr(where, spy)
    with pytest.raises(_Reached):
        main(_command_line(command, tmp_path, saved_policy) + flag + ["--quiet"])
    assert placed == [(torch.device("cuda", 1) if flag else torch.device("cuda"), torch.float32)]


def test_the_hf_backend_gets_device_and_dtype_and_keeps_them_in_copies():
    with FakeCuda() as fake:
        policy = HFPolicy(tiny_llama(build_tokenizer()), build_tokenizer(), device=resolve_device("auto"),
                          dtype=resolve_dtype("bfloat16", resolve_device("cuda")))
        ids, mask = policy.encode_prompts(["State the final answer: 4 - 1 =", "Let me add 3"])
        out = policy.sample(ids, mask, SamplingConfig(max_new_tokens=4), torch.Generator().manual_seed(0))
        logprobs, _ = policy.score(ids, mask, out.completion_ids, out.completion_mask, entropy=True)
        clone = policy.copy()
        for p in (policy, clone):
            weight = next(p.model.parameters())
            assert fake.is_cuda(weight) and weight.dtype == torch.bfloat16
        assert fake.is_cuda(logprobs) and logprobs.dtype == torch.float32


def test_the_emulated_device_refuses_what_cuda_refuses():
    """The emulation the placement tests rely on fails a mixed-device op (so they can fail)."""
    with FakeCuda() as fake:
        on_gpu = torch.zeros(3, device="cuda")
        assert fake.is_cuda(on_gpu) and on_gpu.device == torch.device("cuda", 0)
        assert fake.is_cuda(on_gpu + torch.tensor(1.0))  # a CPU scalar is allowed, as on CUDA
        with pytest.raises(RuntimeError, match="same device"):
            on_gpu + torch.zeros(3)
        with pytest.raises(RuntimeError, match="same device"):
            torch.cat([on_gpu, torch.zeros(1)])
        with pytest.raises(RuntimeError, match="generator"):
            torch.multinomial(on_gpu + 1, 1, generator=torch.Generator())
        with pytest.raises(RuntimeError, match="indices"):
            torch.zeros(3)[torch.zeros(1, dtype=torch.long, device="cuda")]
        assert not fake.is_cuda(on_gpu.cpu()) and on_gpu[torch.tensor([0])].device.type == "cuda"


# one step of each way a step builds its tensors: plain sampling + KL reference, segment credit (rredcot's weight
# mode), self-conditioned KL (sc_grpo), MC continuations (vineppo), resets with a value localiser (srpo), DAPO's
# resampling with the overlong penalty, and counterfactual segment attribution
# (the last four are `make test-slow`'s: ~30 s each on 2 shared cores)
STEPS = [("grpo", ["loss.kl_coef=0.1"]), ("sc_grpo", []), ("srpo", ["reset.localiser=value"]),
         pytest.param("rredcot", ["credit.mode=weight"], marks=pytest.mark.slow),
         pytest.param("vineppo", ["credit.k=2"], marks=pytest.mark.slow),
         pytest.param("dapo", ["sampling.max_new_tokens=16", "overlong_buffer=4"], marks=pytest.mark.slow),
         pytest.param("counterfactual", [], marks=pytest.mark.slow)]


@pytest.mark.parametrize("method,extra", STEPS)
def test_a_training_step_keeps_every_tensor_on_the_chosen_device(method, extra, tmp_path, saved_policy):
    with FakeCuda() as fake:
        config = load_train_config(None, ["device=auto", "steps=1", "prompts_per_step=2", "group_size=2",
                                          "sampling.max_new_tokens=8", "eval_n=2", "final_eval_n=2", f"method={method}",
                                          f"start={saved_policy}", *extra])
        trainer = Trainer(config, str(tmp_path / "run"), progress=False)
        assert trainer.policy.device == torch.device("cuda")
        assert all(fake.is_cuda(p) for p in trainer.policy.model.parameters())
        summary = trainer.train()
    assert summary["step"] == 1 and fake.ops > 1000
    recorded = yaml.safe_load(open(tmp_path / "run" / "config.yaml"))
    assert recorded["device"] == "cuda"  # `auto` as resolved


def test_eval_and_audit_run_on_the_chosen_device(tmp_path, saved_policy):
    with FakeCuda() as fake:
        assert main(["eval", "--checkpoint", saved_policy, "--n", "4", "--k", "2", "--max-new-tokens", "8",
                     "--device", "cuda", "--quiet"]) == 0
        assert main(["audit", "--checkpoint", saved_policy, "--n", "4", "--group-size", "2", "--k-ref", "2",
                     "--methods", "vineppo:k=2,rredcot", "--localisers", "value,oracle", "--set", "max_new_tokens=8",
                     "--device", "cuda", "--out", str(tmp_path / "audit"), "--quiet"]) == 0
    report = json.load(open(tmp_path / "audit" / "audit.json"))
    assert report["config"]["device"] == "cuda" and report["config"]["failures"] == {}
    localisers = json.load(open(tmp_path / "audit" / "localisers.json"))
    assert localisers["failures"] == {}
    oracle = localisers["localisers"]["oracle"]  # every labelled first error's kind counted once, and found
    assert localisers["traces"] > 0 and sum(oracle["slip_counts"].values()) == localisers["traces"]
    assert set(oracle["top1_by_slip"].values()) == {1.0}
    assert fake.ops > 1000


@pytest.mark.slow
def test_show_runs_on_the_chosen_device(tmp_path, saved_policy):
    with FakeCuda() as fake:
        assert main(["show", "--checkpoint", saved_policy, "--n", "1", "--k-ref", "2", "--set", "group_size=2",
                     "--set", "max_new_tokens=8", "--device", "cuda", "--out", str(tmp_path / "show"), "--quiet"]) == 0
    assert os.path.isfile(tmp_path / "show" / "index.html") and fake.ops > 1000


def test_a_run_records_the_device_it_ran_on_and_old_runs_read_as_cpu(tmp_path, saved_policy, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trainer = Trainer(load_train_config(None, ["steps=1", f"start={saved_policy}"]), str(tmp_path / "run"),
                      progress=False)
    assert trainer.config.device == "cpu"  # `auto`, resolved
    old = {k: v for k, v in to_dict(trainer.config).items() if k not in ("device", "dtype")}
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # read back on a GPU machine
    assert config_from_run(str(tmp_path / "old")).device == "cpu"  # written before devices were a setting


@no_cuda
def test_resume_continues_on_the_recorded_device_and_moves_only_when_asked(tmp_path, saved_policy, capsys):
    run = str(tmp_path / "run")
    assert main(["train", "--start", saved_policy, "--steps", "1", "--set", "checkpoint_every=1", "--set",
                 "prompts_per_step=2", "--set", "group_size=2", "--set", "eval_n=2", "--set", "final_eval_n=2",
                 "--set", "sampling.max_new_tokens=8", "--out", run, "--quiet"]) == 0
    assert yaml.safe_load(open(os.path.join(run, "config.yaml")))["device"] == "cpu"
    capsys.readouterr()
    with FakeCuda():  # a GPU machine: without --device the run stays on the CPU, silently
        assert main(["train", "--resume", run, "--steps", "2", "--quiet"]) == 0
        assert "continues on" not in capsys.readouterr().err
        assert yaml.safe_load(open(os.path.join(run, "config.yaml")))["device"] == "cpu"
        assert main(["train", "--resume", run, "--steps", "3", "--device", "cuda", "--quiet"]) == 0
        assert "trained on cpu and continues on cuda, as asked" in capsys.readouterr().err
    assert yaml.safe_load(open(os.path.join(run, "config.yaml")))["device"] == "cuda"
    # back on a machine without CUDA: one line saying how to continue on the CPU
    assert main(["train", "--resume", run, "--steps", "4", "--quiet"]) == 2
    assert "pass --device cpu to continue it on the CPU" in _stderr_line(capsys)
    assert main(["train", "--resume", run, "--steps", "4", "--device", "cpu", "--quiet"]) == 0


def test_compare_runs_one_job_at_a_time_on_a_gpu_unless_told(capsys):
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert jobs_on(cpu, 4, share_gpu=False) == 4
    assert jobs_on(gpu, 4, share_gpu=True) == 4
    assert jobs_on(gpu, 4, share_gpu=False) == 1
    assert "--jobs 4 on cuda runs one training at a time (--set share_gpu=true" in capsys.readouterr().err


def test_the_audit_cache_keys_cpu_references_as_before_and_others_apart(saved_policy):
    config = AuditConfig(checkpoint=saved_policy, n=4, group_size=2, segmenter="lines")
    before = hashlib.sha256(repr((checkpoint_digest(saved_policy), config.task, sorted(config.task_options.items()),
                                  config.seed, config.n, config.group_size, config.k_ref, config.segmenter,
                                  config.temperature, config.max_new_tokens)).encode()).hexdigest()[:16]
    assert reference_key(config, saved_policy, torch.device("cpu"), torch.float32) == before
    assert reference_key(config, saved_policy, torch.device("cuda"), torch.float32) != before
    assert reference_key(config, saved_policy, torch.device("cuda"), torch.bfloat16) != \
        reference_key(config, saved_policy, torch.device("cuda"), torch.float32)


def test_device_cpu_and_auto_without_cuda_give_the_same_eval_as_no_setting(saved_policy, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    outputs = []
    for flag in ([], ["--device", "cpu"], ["--device", "auto"]):
        assert main(["eval", "--checkpoint", saved_policy, "--n", "8", "--k", "2", "--max-new-tokens", "16",
                     "--quiet", *flag]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2]
    assert device_name(torch.device("cuda", 1)) == "cuda:1" and device_name(torch.device("cpu")) == "cpu"


def test_a_tiny_policy_refuses_bfloat16(saved_policy):
    with pytest.raises(ConfigError, match="tiny policy, which runs float32"):
        load_policy(saved_policy, dtype=torch.bfloat16)
    assert tiny_policy().device == torch.device("cpu")


def test_a_comparison_continues_only_on_the_device_its_runs_recorded(tmp_path, saved_policy):
    from credo.lab.compare.presets import check_reusable, resolve_preset, run_config, run_dir_name
    preset = resolve_preset("smoke", None, None, None, None)
    on = {d: dataclasses.replace(preset, train={**preset.train, "device": d}) for d in ("cpu", "cuda")}
    run_dir = tmp_path / "runs" / run_dir_name("grpo", 0)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(run_config("grpo", 0, on["cpu"], saved_policy))))
    plan = [("grpo", 0, str(run_dir))]
    check_reusable(plan, on["cpu"], saved_policy)
    with pytest.raises(ConfigError, match="device: 'cpu' -> 'cuda'.*pass --device cpu to continue it where it ran"):
        check_reusable(plan, on["cuda"], saved_policy)


def test_bfloat16_mixed_warns_on_a_cpu_without_bfloat16_units_and_only_there(tmp_path, monkeypatch):
    from credo.policy import device
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    amx = tmp_path / "amx"
    amx.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")
    arm = tmp_path / "arm"
    arm.write_text("Features\t: fp asimd bf16 i8mm\n")
    assert device.cpu_has_bfloat16_units(str(avx2)) is False
    assert device.cpu_has_bfloat16_units(str(amx)) is True and device.cpu_has_bfloat16_units(str(arm)) is True
    assert device.cpu_has_bfloat16_units(str(tmp_path / "missing")) is None
    for units, warns in ((False, True), (True, False), (None, False)):
        monkeypatch.setattr(device, "cpu_has_bfloat16_units", lambda units=units: units)
        monkeypatch.setattr(device, "_WARNED", set())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert resolve_dtype("bfloat16-mixed", torch.device("cpu"), "train.dtype") == torch.float32
            resolve_dtype("bfloat16-mixed", torch.device("cpu"), "compare.dtype")  # once a process: not again
            resolve_dtype("float32", torch.device("cpu"))
        said = [str(w.message) for w in caught if issubclass(w.category, device.SlowBfloat16Warning)]
        assert len(said) == int(warns) and all(s.startswith("train.dtype=bfloat16-mixed: ") for s in said)
