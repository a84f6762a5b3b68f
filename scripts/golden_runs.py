"""Golden runs: short trainings whose metrics, final weights and checkpoint state are hashed, so a refactor can be
shown to change no behaviour.

    python scripts/golden_runs.py OUT            # runs every golden method into OUT/<name>, prints OUT/golden.json
    python scripts/golden_runs.py OUT --check A  # ... and compares with an earlier golden.json (exit 1 on a difference)

Timing fields (`seconds`) and the recorded commit (`credo_commit`) are dropped before hashing: they differ between
any two runs. Everything else in metrics.jsonl, every file under final/ and checkpoints/, and summary.json's numbers
are hashed byte for byte. The data-parallel run uses two gloo processes (tests/dp_worker.py's launcher).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys

COMMON = ["--steps", "3", "--quiet", "--set", "prompts_per_step=2", "--set", "group_size=4", "--set", "eval_n=20",
          "--set", "final_eval_n=20", "--set", "eval_every=2", "--set", "checkpoint_every=2",
          "--set", "sampling.max_new_tokens=48"]
GOLDEN = {
    "grpo": ["--method", "grpo"],
    "dapo": ["--method", "dapo"],
    "rredcot": ["--method", "rredcot"],
    "srpo": ["--method", "srpo"],
    "sc_grpo": ["--method", "sc_grpo"],
    "vineppo": ["--method", "vineppo", "--set", "credit.k=2"],
    "shuffled": ["--method", "shuffled:of=rredcot"],
    "prefix_shaping": ["--method", "prefix_shaping"],
}
VOLATILE = ("seconds", "credo_commit")  # the only fields that differ between two runs of the same code


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def stable_json_lines(path):
    rows = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            rows.append({k: v for k, v in row.items() if k not in VOLATILE})
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def stable(value):
    """`value` (parsed JSON) without its volatile fields, at any depth."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def hash_file(path):
    """A JSON file's stable content (a manifest's hash of trainer_state.json, which holds timings, left out), or the
    file's bytes."""
    if not path.endswith(".json"):
        return sha(path)
    with open(path) as f:
        value = stable(json.load(f))
    if os.path.basename(path) == "manifest.json":
        value["sha256"].pop("trainer_state.json", None)
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(run):
    out = {"metrics": stable_json_lines(os.path.join(run, "metrics.jsonl"))}
    with open(os.path.join(run, "summary.json")) as f:
        summary = {k: v for k, v in json.load(f).items() if k not in VOLATILE}
    out["summary"] = hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()[:16]
    for sub in ("final", "checkpoints"):
        root = os.path.join(run, sub)
        for dirpath, _, files in sorted(os.walk(root)):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, run)] = hash_file(path)
    return out


def train(out, args):
    cmd = [sys.executable, "-m", "credo.cli", "train", "--out", out, *args, *COMMON]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"golden run failed: {' '.join(cmd)}\n{result.stderr[-2000:]}")


def data_parallel(out):
    """Two gloo processes train grpo from the arith start (the same launcher tests/test_distributed.py uses)."""
    here = os.path.dirname(os.path.abspath(__file__))
    worker = os.path.join(here, "..", "tests", "dp_worker.py")
    start = ""  # the task's SFT start
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_port=29533", worker, out, start]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"data-parallel golden run failed\n{result.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--check", help="an earlier golden.json to compare with")
    ap.add_argument("--only", nargs="*", help="names of golden runs to run (default: all)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    result = {}
    names = a.only or [*GOLDEN, "grpo_dp2"]
    for name in names:
        run = os.path.join(a.out, name)
        if os.path.exists(run):
            sys.exit(f"{run} exists: give an OUT that holds no earlier golden run")
        if name == "grpo_dp2":
            data_parallel(run)
        else:
            train(run, GOLDEN[name])
        result[name] = fingerprint(run)
        print(name, result[name]["metrics"], result[name].get("final/model.safetensors"), flush=True)
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    if a.check:
        with open(a.check) as f:
            before = json.load(f)
        diff = [f"{n}: {k}" for n in result for k in set(result[n]) | set(before.get(n, {}))
                if result[n].get(k) != before.get(n, {}).get(k)]
        print("identical" if not diff else "DIFFERENT:\n  " + "\n  ".join(diff))
        sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
