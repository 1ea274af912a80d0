#!/bin/bash
# GRPO on Qwen3-0.6B (dense) with dapo-math-17k, one node of 8 GPUs.
# Trainer: TP1, DP8, no recompute, dynamic batches of 9216 tokens per GPU, distributed Adam on GPU.
# Rollout: eight SGLang engines of 1 GPU each.
#
# Env: MODEL_DIR (default /root) holds the checkpoints and data; FP8=1 serves the FP8 checkpoint;
# COLOCATE=0 splits the node (trainer on GPUs 0-3, engines on 4-7) instead of sharing all 8;
# ASYNC=1 runs train_async.py (one-step-off; implies COLOCATE=0); WANDB_API_KEY (or WANDB_KEY) logs to wandb;
# PYTHON picks the interpreter; MASTER_ADDR is the head node's IP. Extra arguments are appended to
# the entry point's flags (a later flag wins, e.g. --actor-num-nodes 2); with --dry-run the plan is
# printed by the entry point directly (no Ray) and the script exits with its status.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
REPO_DIR="$(cd -- "${SCRIPT_DIR}/.." &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/qwen3-0.6B.sh"

MODEL_DIR=${MODEL_DIR:-/root}
PYTHON=${PYTHON:-python3}
ASYNC=${ASYNC:-0}
COLOCATE=${COLOCATE:-1}
ENTRY=train.py
if [ "${ASYNC}" = "1" ]; then
   # one-step-off generation needs GPUs of its own
   ENTRY=train_async.py
   COLOCATE=0
fi

HF_CHECKPOINT=${MODEL_DIR}/Qwen3-0.6B
if [ "${FP8:-0}" = "1" ]; then
   # FP8 weights for inference only; the trainer still loads the bf16 torch_dist reference.
   HF_CHECKPOINT=${MODEL_DIR}/Qwen3-0.6B-FP8
fi

CKPT_ARGS=(
   --hf-checkpoint ${HF_CHECKPOINT}
   --ref-load ${MODEL_DIR}/Qwen3-0.6B_torch_dist
   --load ${MODEL_DIR}/Qwen3-0.6B_slime/
   --save ${MODEL_DIR}/Qwen3-0.6B_slime/
   --save-interval 20
)

ROLLOUT_ARGS=(
   --prompt-data ${MODEL_DIR}/dapo-math-17k/dapo-math-17k.jsonl
   --input-key prompt
   --label-key label
   --apply-chat-template
   --rollout-shuffle
   --rm-type deepscaler
   --num-rollout 3000
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   --rollout-max-response-len 8192
   --rollout-temperature 1
   --global-batch-size 256
   --balance-data
)

EVAL_ARGS=(
   --eval-interval 20
   --eval-prompt-data aime ${MODEL_DIR}/aime-2024/aime-2024.jsonl
   --n-samples-per-eval-prompt 16
   --eval-max-response-len 16384
   --eval-top-p 1
)

PERF_ARGS=(
   --tensor-model-parallel-size 1
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --expert-model-parallel-size 1
   --expert-tensor-parallel-size 1

   # --micro-batch-size 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 9216
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --use-kl-loss
   --kl-loss-coef 0.00
   --kl-loss-type low_var_kl
   --entropy-coef 0.00
   --eps-clip 0.2
   --eps-clip-high 0.28
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
   # optimizer states sharded over the DP ranks
   --use-distributed-optimizer
)

# wandb: the key travels by environment only (WANDB_API_KEY; WANDB_KEY is accepted as its old name),
# never on a command line, where ps and Ray's job records would show it (see docs/security.md)
WANDB_ARGS=()
if [ -n "${WANDB_API_KEY:-${WANDB_KEY:-}}" ]; then
   export WANDB_API_KEY="${WANDB_API_KEY:-${WANDB_KEY}}"
   WANDB_ARGS=(
      --use-wandb
      --wandb-project slime-dev
      --wandb-group qwen3-0.6B
   )
fi

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 1
   --sglang-mem-fraction-static 0.7
)

MISC_ARGS=(
   # bf16 weights with fp32 master copies in the optimizer
   --bf16
   # default dropout in megatron is 0.1
   --attention-dropout 0.0
   --hidden-dropout 0.0
   # should be good for model performance
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   # need to comment this when using model with MLA
   --attention-backend flash
   # metrics.jsonl, one line per rollout (see docs/gpu-guide.md, "Reading the metrics")
   --metrics-dir ${MODEL_DIR}/Qwen3-0.6B_slime/metrics
)

if [ "${COLOCATE}" = "1" ]; then
   CLUSTER_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate)
else
   CLUSTER_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node 4 --rollout-num-gpus 4)
fi

TRAIN_ARGS=(
   "${CLUSTER_ARGS[@]}"
   "${MODEL_ARGS[@]}"
   "${CKPT_ARGS[@]}"
   "${ROLLOUT_ARGS[@]}"
   "${OPTIMIZER_ARGS[@]}"
   "${GRPO_ARGS[@]}"
   "${WANDB_ARGS[@]}"
   "${PERF_ARGS[@]}"
   "${EVAL_ARGS[@]}"
   "${SGLANG_ARGS[@]}"
   "${MISC_ARGS[@]}"
   "$@"
)

# shellcheck disable=SC1091
source "${REPO_DIR}/scripts/lib/ray_job.sh"
run_train_job "${ENTRY}" "${TRAIN_ARGS[@]}"
