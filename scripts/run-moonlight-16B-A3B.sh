#!/bin/bash
# GRPO on Moonlight-16B-A3B (Moonlight-16B-A3B-Instruct; DeepseekV3ForCausalLM, ~16B params, ~3B
# active), one node of 8 GPUs, trainer and SGLang engine colocated.
# Trainer: TP2 + SP, EP8, ETP1, full recompute, dynamic batches of 8192 tokens per GPU, CPU Adam.
# Rollout: one SGLang engine over the 8 GPUs with EP8 and DP attention.
#
# Env: MODEL_DIR (default /root) holds the checkpoints and data; HF_NAME (default
# Moonlight-16B-A3B-Instruct) the HF folder in it; WANDB_KEY logs to wandb; PYTHON picks the
# interpreter; MASTER_ADDR is the head node's IP. Extra arguments are appended to train.py's flags;
# with --dry-run the plan is printed by train.py directly (no Ray) and the script exits with its
# status.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
REPO_DIR="$(cd -- "${SCRIPT_DIR}/.." &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/moonlight-16B-A3B.sh"

MODEL_DIR=${MODEL_DIR:-/root}
PYTHON=${PYTHON:-python3}
HF_NAME=${HF_NAME:-Moonlight-16B-A3B-Instruct}

CKPT_ARGS=(
   --hf-checkpoint ${MODEL_DIR}/${HF_NAME}
   --ref-load ${MODEL_DIR}/${HF_NAME}_torch_dist
   --load ${MODEL_DIR}/${HF_NAME}_slime/
   --save ${MODEL_DIR}/${HF_NAME}_slime/
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
   --rollout-max-response-len 32768
   --rollout-temperature 1
   --global-batch-size 256
   --balance-data
)

EVAL_ARGS=(
   --eval-interval 20
   --eval-prompt-data aime ${MODEL_DIR}/aime-2024/aime-2024.jsonl
   --n-samples-per-eval-prompt 8
   --eval-max-response-len 32768
   --eval-top-p 1
)

PERF_ARGS=(
   --tensor-model-parallel-size 2
   --sequence-parallel
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --expert-model-parallel-size 8
   --expert-tensor-parallel-size 1

   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1

   --use-dynamic-batch-size
   --max-tokens-per-gpu 8192
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

   # CPU Adam: optimizer states live in host RAM
   --optimizer-cpu-offload
   --overlap-cpu-optimizer-d2h-h2d
   --use-precision-aware-optimizer
)

WANDB_ARGS=()
if [ -n "${WANDB_KEY:-}" ]; then
   WANDB_ARGS=(
      --use-wandb
      --wandb-project slime-dev
      --wandb-group ${HF_NAME}
      --wandb-key "${WANDB_KEY}"
   )
fi

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 8
   --sglang-mem-fraction-static 0.7
   --sglang-ep-size 8
   --sglang-enable-dp-attention
   --sglang-dp-size 8
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
   # no --attention-backend flash: MLA's 192 / 128 query-key / value head dims go to TE's fused attention
   # megatron-core fuses MLA's rope only with YaRN (MLATransformerConfig refuses it with plain rope,
   # Moonlight's rope_scaling is null)
   --no-rope-fusion
)

TRAIN_ARGS=(
   --actor-num-nodes 1
   --actor-num-gpus-per-node 8
   --colocate
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
run_train_job "train.py" "${TRAIN_ARGS[@]}"
