#!/usr/bin/env bash
# verl on GPUs: verl's own GRPO vs a credo estimator, same model/data/batch/steps; prints tokens/s and the
# credit overhead ratio from verl's metrics (examples/gpu/verl_summary.py).
#   bash examples/gpu/verl_throughput.sh rredcot Qwen/Qwen2.5-1.5B-Instruct 8
#   python examples/gpu/verl_summary.py --dry-run        # CPU: the worker-side credit path on a tiny model
# Needs verl's full GPU install (verl[vllm]==0.9.1); not runnable on the CPU machine this repo is tested on.
set -euo pipefail
ESTIMATOR=${1:-rredcot}
MODEL=${2:-Qwen/Qwen2.5-1.5B-Instruct}
GPUS=${3:-8}
export STEPS=${STEPS:-20}
OUT_ROOT=${OUT_ROOT:-runs}  # where both runs go (examples/gpu/acceptance.sh gives its own directory)
cd "$(dirname "$0")/../.."
OUT=$OUT_ROOT/verl-grpo bash examples/verl/run_credo_gpu.sh grpo "$MODEL" "$GPUS"
OUT=$OUT_ROOT/verl-$ESTIMATOR bash examples/verl/run_credo_gpu.sh "$ESTIMATOR" "$MODEL" "$GPUS"
python examples/gpu/verl_summary.py "$OUT_ROOT/verl-grpo/metrics.jsonl" "$OUT_ROOT/verl-$ESTIMATOR/metrics.jsonl"
