"""The in-process part of the GPU smoke (examples/gpu/acceptance.sh --smoke): where the model lands, in which
dtype, how fast it samples, and credo's credit checks on what it sampled. One PASS/FAIL line per check; the
numbers go to OUT_JSON.

    python examples/gpu/smoke.py --model DIR --out OUT_JSON              # CUDA, the model in bfloat16
    python examples/gpu/smoke.py --dry-run --model DIR --out OUT_JSON    # the CPU, float32, tiny sizes

Checks:
  device     credo's `auto` device is CUDA (the CPU in a dry run) and every weight of the loaded policy is on it
  bfloat16   every weight is bfloat16 (float32 in a dry run: bfloat16 weights are refused on the CPU) and a
             forward pass gives finite logits
  sample     G completions for P gym:chain_sum prompts: generated tokens/s (after one warm-up batch)
  credit     grpo, rloo and rredcot on that batch through a Probe on the device: credo's adapter checks (finite,
             aligned, zero on padding and masked tokens, GRPO-family group sums) pass, seconds each (vineppo's Monte
             Carlo credit is the full check's audit)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

ESTIMATORS = ("grpo", "rloo", "rredcot")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--out", required=True, help="JSON file for the numbers")
    parser.add_argument("--dry-run", action="store_true", help="the CPU, float32, 2 prompts x 2 completions")
    args = parser.parse_args()
    from credo.policy import bind_task, load_policy
    from credo.core.protocols import SamplingConfig
    from credo.policy.device import resolve_device
    from credo.tasks import make_task
    device = resolve_device("cpu" if args.dry_run else "auto")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    prompts, group, max_new = (2, 2, 8) if args.dry_run else (16, 8, 128)
    setup: dict = {"device": str(device), "dtype": str(dtype).replace("torch.", ""), "prompts": prompts,
                   "group_size": group, "max_new_tokens": max_new}
    found: dict = {"setup": setup, "checks": {}}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        setup["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}"
        print(f"GPU: {setup['gpu']}")
    task = make_task("gym:chain_sum", {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 1})
    failed = 0

    def check(name: str, fn) -> object:  # noqa: ANN001
        nonlocal failed
        started = time.perf_counter()
        try:
            value = fn()
        except Exception as err:  # noqa: BLE001 (reported as the check's FAIL line, the smoke goes on)
            failed += 1
            found["checks"][name] = {"passed": False, "error": f"{type(err).__name__}: {err}"}
            print(f"FAIL {name} ({time.perf_counter() - started:.1f} s): {type(err).__name__}: {err}", flush=True)
            traceback.print_exc(file=sys.stderr)
            return None
        found["checks"][name] = {"passed": True, "seconds": time.perf_counter() - started, **(value or {})}
        print(f"PASS {name} ({time.perf_counter() - started:.1f} s) {json.dumps(value or {})}", flush=True)
        return value

    policy = None

    def placed() -> dict:
        nonlocal policy
        policy = bind_task(load_policy(args.model, device=device, dtype=dtype), task)
        places = {str(p.device) for p in policy.model.parameters()}
        if places != {str(torch.empty(0, device=device).device)}:
            raise AssertionError(f"weights on {sorted(places)}, not on {device}")
        weights = sum(p.numel() for p in policy.model.parameters())
        memory = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
        return {"parameters": weights, "allocated_mib": round(memory, 1)}

    def in_dtype() -> dict:
        kinds = {str(p.dtype) for p in policy.model.parameters()}
        if kinds != {str(dtype)}:
            raise AssertionError(f"weights in {sorted(kinds)}, not {dtype}")
        ids, mask = policy.encode_prompts([task.train_problems(1, torch.Generator().manual_seed(0))[0].prompt])
        with torch.no_grad():
            logits = policy.model(input_ids=ids, attention_mask=mask).logits
        if not torch.isfinite(logits).all():
            raise AssertionError("the forward pass gave non-finite logits")
        return {"logits_dtype": str(logits.dtype).replace("torch.", "")}

    rollouts = None

    def sample() -> dict:
        nonlocal rollouts
        from credo.strategies.sampling import sample_scored
        sampling = SamplingConfig(1.0, 1.0, max_new)
        problems = task.train_problems(prompts, torch.Generator().manual_seed(1))
        sample_scored(policy, task, problems[:1], group, sampling, torch.Generator(device="cpu").manual_seed(0))
        sync(device)
        started = time.perf_counter()
        rollouts = sample_scored(policy, task, problems, group, sampling, torch.Generator(device="cpu").manual_seed(2))
        sync(device)
        seconds = time.perf_counter() - started
        tokens = int(rollouts.completion_mask.sum())
        return {"generated_tokens": tokens, "generated_tokens_per_s": round(tokens / seconds, 1)}

    def credit() -> dict:
        from credo import credit as registry
        from credo.core.probe import Probe
        from credo.integrations.checks import Where, check_advantages, check_group_sums
        seconds = {}
        real = rollouts.completion_mask.bool()
        for name in ESTIMATORS:
            probe = Probe(policy, task, SamplingConfig(1.0, 1.0, max_new), torch.Generator().manual_seed(3))
            started = time.perf_counter()
            result = registry.get(name)(rollouts, probe)
            sync(device)
            seconds[name] = round(time.perf_counter() - started, 3)
            where = Where(step=f"smoke ({name})", off="nothing")
            advantages = result.advantages if result.weights is None else result.advantages * result.weights
            trainable = result.mask.bool() if getattr(result, "mask", None) is not None else real
            check_advantages(advantages.float(), real, trainable & real, where)
            if name in ("grpo", "rloo"):
                check_group_sums(advantages.float(), trainable & real, rollouts.group, where)
        return {"seconds": seconds}

    if check("device", placed) is not None:
        check("bfloat16", in_dtype)
        if check("sample", sample) is not None:
            check("credit", credit)
    else:
        failed += 3
    with open(args.out, "w") as f:
        json.dump(found, f, indent=2)
        f.write("\n")
    return 1 if failed else 0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    sys.exit(main())
