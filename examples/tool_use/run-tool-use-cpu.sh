#!/bin/bash
# GRPO on the tiny MoE (scripts/models/qwen3-tiny-moe.sh) with multi-turn tool use, on CPU:
# "n%3" (n up to 999) answered by calling a calculator (examples/tool_use/calculator_task.py).
# Trainer: 2 gloo processes, EP2, dynamic batches; rollout: one local SGLang-compatible engine.
# Every model turn is one token. The first turn is a call (whatever the token); after it a digit is
# the answer and any other token another call (at most 2). A call appends the calculator's answer
# (the bare digit) with loss mask 0. Reward: 1 for the right answer, else 0 (exact match, no shaping).
# TOOL=0 is the baseline: the same script and turns, the tool answers nothing (`?`).
# Seen (README.md): see the curves there for reward per rollout, wall time and load.
#
# Outputs in SLIME_RUN_DIR (default runs/tool-use-cpu, TOOL=0: runs/tool-use-cpu-no-tool):
# metrics.jsonl (one row per rollout), curve.png, hf_final/ (the trained policy, HF format), ckpt/.
# Env: TOOL (1 default, 0 baseline), NUM_ROLLOUT (default 100), LR (default 2e-3), ASYNC=1 runs
# train_async.py (the next rollout is generated while the trainer trains on the current one),
# DRY_RUN=1 only prints train.py's plan. Extra arguments are appended to train.py's flags.
# Re-running reuses the model, data and torch_dist checkpoint already built and resumes from the
# run's last checkpoint; pass --overwrite-run to start afresh in the same folder.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
REPO_DIR="$(cd -- "${SCRIPT_DIR}/../.." &>/dev/null && pwd)"
cd "${REPO_DIR}"

# shellcheck disable=SC1091
source scripts/lib/venv.sh
ensure_venv
export PYTHONPATH="${REPO_DIR}${PYTHONPATH:+:${PYTHONPATH}}"

TOOL=${TOOL:-1}
case "${TOOL}" in
   1) GENERATE=generate; DEFAULT_RUN_DIR=runs/tool-use-cpu ;;
   0) GENERATE=generate_without_tool; DEFAULT_RUN_DIR=runs/tool-use-cpu-no-tool ;;
   *) echo "TOOL=${TOOL}: expected 1 (calculator) or 0 (the tool answers nothing)" >&2; exit 2 ;;
esac
case "${ASYNC:-0}" in
   0) ENTRY=train.py ;;
   1) ENTRY=train_async.py ;;
   *) echo "ASYNC=${ASYNC}: expected 0 (train.py) or 1 (train_async.py)" >&2; exit 2 ;;
esac
RUN_DIR=${SLIME_RUN_DIR:-${DEFAULT_RUN_DIR}}
RUN_DIR="$(mkdir -p "${RUN_DIR}" && cd "${RUN_DIR}" && pwd)"
NUM_ROLLOUT=${NUM_ROLLOUT:-100}
LR=${LR:-2e-3}
DRY_RUN=${DRY_RUN:-0}

if [ ! -f "${RUN_DIR}/hf/model.safetensors" ]; then
   python tools/make_tiny_model.py --output-dir "${RUN_DIR}/hf" --variant moe --seed 0
fi
DATA_DIR="${RUN_DIR}/data-mod3"
if [ ! -f "${DATA_DIR}/eval.jsonl" ]; then
   python tools/make_toy_data.py --output-dir "${DATA_DIR}" --task mod3 --seed 0 --num-train 4096
fi

source scripts/models/qwen3-tiny-moe.sh

# The trainer's reference weights: the HF checkpoint converted to Megatron torch_dist, once.
if [ "${DRY_RUN}" != "1" ] && [ ! -f "${RUN_DIR}/torch_dist/latest_checkpointed_iteration.txt" ]; then
   python tools/convert_hf_to_torch_dist.py "${MODEL_ARGS[@]}" \
      --hf-checkpoint "${RUN_DIR}/hf" --save "${RUN_DIR}/torch_dist"
fi

# Re-running resumes (--load = --save) unless --overwrite-run is among the extra arguments.
LOAD_ARGS=(--load "${RUN_DIR}/ckpt")
for arg in "$@"; do
   [ "${arg}" = "--overwrite-run" ] && LOAD_ARGS=()
done

CKPT_ARGS=(
   --hf-checkpoint "${RUN_DIR}/hf"
   --ref-load "${RUN_DIR}/torch_dist"
   --save "${RUN_DIR}/ckpt"
   "${LOAD_ARGS[@]}"
   --save-hf "${RUN_DIR}/hf_final"
   # at the end only
   --save-interval "${NUM_ROLLOUT}"
)

ROLLOUT_ARGS=(
   --prompt-data "${DATA_DIR}/train.jsonl"
   --input-key prompt
   --label-key label
   --metadata-key metadata
   --apply-chat-template
   --rollout-shuffle
   # the multi-turn generate function and its reward (examples/tool_use/calculator_task.py)
   --custom-generate-function-path "examples.tool_use.calculator_task.${GENERATE}"
   --custom-rm-path examples.tool_use.calculator_task.reward
   --num-rollout "${NUM_ROLLOUT}"
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   # the whole response, tool results included: two calls (a token and the tool's digit, twice) and the answer
   --rollout-max-response-len 5
   --rollout-temperature 1.0
   # one optimizer step per rollout
   --global-batch-size 256
)

EVAL_ARGS=(
   --eval-interval 20
   --eval-prompt-data mod3 "${DATA_DIR}/eval.jsonl"
)

PERF_ARGS=(
   --tensor-model-parallel-size 1
   --expert-model-parallel-size 2
   --use-dynamic-batch-size
   --max-tokens-per-gpu 4096
   # every model token weighs the same: with the default per-sample mean, a one-token answer
   # without a call outweighs each token of a 3-turn trajectory 3:1, and the run settled on
   # answering without the tool (reward ~0.3 from rollout 35 on)
   --calculate-per-token-loss
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --eps-clip 0.2
   --eps-clip-high 0.28
   --use-kl-loss
   --kl-loss-coef 0.0
   --kl-loss-type low_var_kl
   --entropy-coef 0.0
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr "${LR}"
   --lr-decay-style constant
   --weight-decay 0.0
   --adam-beta1 0.9
   --adam-beta2 0.98
)

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 1
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --distributed-backend gloo
   --seed 1234
   --metrics-dir "${RUN_DIR}"
)

ARGS=(
   --actor-num-nodes 1
   --actor-num-gpus-per-node 2
   --rollout-num-gpus 1
   "${MODEL_ARGS[@]}"
   "${CKPT_ARGS[@]}"
   "${ROLLOUT_ARGS[@]}"
   "${EVAL_ARGS[@]}"
   "${PERF_ARGS[@]}"
   "${GRPO_ARGS[@]}"
   "${OPTIMIZER_ARGS[@]}"
   "${SGLANG_ARGS[@]}"
   "${MISC_ARGS[@]}"
)

echo "[run-tool-use-cpu] tool: ${TOOL} (${GENERATE})  entry: ${ENTRY}  run dir: ${RUN_DIR}"
if [ "${DRY_RUN}" = "1" ]; then
   python "${ENTRY}" "${ARGS[@]}" --dry-run "$@"
   echo "[run-tool-use-cpu] dry run done (without DRY_RUN=1 it trains); outputs would go to ${RUN_DIR}"
   exit 0
fi
python "${ENTRY}" "${ARGS[@]}" "$@"
python tools/plot_metrics.py --metrics "${RUN_DIR}/metrics.jsonl" --output "${RUN_DIR}/curve.png"
echo "[run-tool-use-cpu] done:"
echo "  metrics     ${RUN_DIR}/metrics.jsonl"
echo "  curve       ${RUN_DIR}/curve.png"
echo "  HF policy   ${RUN_DIR}/hf_final"
