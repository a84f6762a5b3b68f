#!/usr/bin/env bash
# verl 0.9.1 PPO with a credo estimator on GPUs: FSDP actor, vLLM rollout, credit on the actor workers.
#   bash examples/verl/run_credo_gpu.sh rredcot Qwen/Qwen2.5-1.5B-Instruct 8     # estimator, model, GPUs
# Needs verl's full GPU install (pip install verl[vllm]==0.9.1) and credo. Not runnable on the CPU machine
# this repository is tested on. Metrics go to $OUT/metrics.jsonl (verl's file logger); examples/gpu/verl_throughput.sh
# reads tokens/s and the credit overhead from it.
set -euo pipefail
ESTIMATOR=${1:-rredcot}
MODEL=${2:-Qwen/Qwen2.5-1.5B-Instruct}
GPUS=${3:-8}
TASK=${TASK:-gym:chain_sum}
STEPS=${STEPS:-50}
OUT=${OUT:-runs/verl-$ESTIMATOR}
DATA=${DATA:-data/chain_sum}
mkdir -p "$OUT"
[ -f "$DATA/train.parquet" ] || python examples/verl/make_data.py --task "$TASK" --out "$DATA"
case "$ESTIMATOR" in
  grpo|rloo|gae) ADV="algorithm.adv_estimator=$ESTIMATOR" ;;        # verl's own, for the baseline
  *) ADV="algorithm.adv_estimator=credo:$ESTIMATOR" ;;
esac
REWARD_FILE=$(python -c "import credo.integrations.verl_credit as m; print(m.__file__)")
VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" python -m credo.integrations.verl_ppo \
  trainer.use_v1=false \
  "$ADV" \
  +credo.task="$TASK" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/val.parquet" \
  data.train_batch_size=128 data.max_prompt_length=512 data.max_response_length=512 \
  reward.custom_reward_function.path="$REWARD_FILE" reward.custom_reward_function.name=compute_score \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  trainer.n_gpus_per_node="$GPUS" trainer.nnodes=1 trainer.total_training_steps="$STEPS" \
  trainer.logger='["console","file"]' trainer.project_name=credo trainer.experiment_name="$ESTIMATOR" \
  trainer.save_freq=-1 trainer.test_freq=10 trainer.default_local_dir="$OUT/ckpt"
