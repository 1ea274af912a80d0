#!/bin/bash
# GRPO on a tiny MoE (the Qwen3-MoE: 2 layers, 8 experts top-2; MODEL_VARIANT below picks another family)
# and the toy parity task, on CPU.
# Trainer: 2 gloo processes, EP2, dynamic batches; rollout: one local SGLang-compatible engine.
# Task: "<n> mod 2" -> "0"/"1"; the answer is one token, so --rollout-max-response-len 1 and the
# `math` reward's exact match on that token is the whole check (the response is cut after it, so
# samples end TRUNCATED by design; no <|im_end|> is asked for). Mean reward starts near 1/128.
# Seen on 2 CPU cores: reward >= 0.9 from rollout ~60, eval 0.99 after 80 rollouts; 71-83 s
# once .venv is installed on idle cores (first rollout at 13-15 s), several times that on busy ones.
#
# TASK=parity_twice picks the multi-token task: "<n> mod 2 twice" -> "00"/"11" and then <|im_end|>
# (3 response tokens, the limit), scored by the `char_match` reward (for a finished response,
# credit per character and for stopping right after the answer; a response cut at the limit
# scores 0; a random model scores about 0.003), --rollout-skip-special-tokens (the response text
# without <|im_end|>), an entropy bonus (--entropy-coef 0.03: without it the policy settles on one
# answer for every prompt once the stop is learnt, mean reward 0.67), NUM_ROLLOUT 200 and LR 2e-3
# by default; outputs in runs/tiny-moe-cpu-parity_twice. Seen: mean reward >= 0.9 from rollout
# ~185 (6 min 13 s after the command started on idle cores, 11 minutes on busy ones), eval 0.98
# after 200 rollouts; see README ("multi-token task").
#
# Outputs in SLIME_RUN_DIR (default runs/tiny-moe-cpu): metrics.jsonl (one row per rollout),
# curve.png (train reward and eval accuracy), hf_final/ (the trained policy, HF format), ckpt/
# (Megatron checkpoint, halfway and at the end).
# MODEL_VARIANT picks the tiny model family (a make_tiny_model.py variant, `--variant` lists them):
# moe (default, Qwen3-MoE), deepseek_v3 (DeepSeek-V3:
# multi-latent attention, YaRN, group-limited sigmoid routing with expert bias, a shared expert; its
# outputs default to runs/tiny-deepseek_v3-cpu) or glm4_moe (GLM-4.5 MoE; runs/tiny-glm4_moe-cpu), each
# with its scripts/models/*-tiny.sh flags and the same tokenizer and task. Seen on busy shared cores
# (parity, defaults): deepseek_v3 mean reward 0.02 -> 0.91 at rollout 70, eval 0.90 at 70 and 0.78 at
# 80 (about 13 s per rollout); glm4_moe 0.02 -> 0.98 at rollout 70, eval 0.99 at 80 (3.5 s per rollout).
# Env: TASK (parity or parity_twice), NUM_ROLLOUT (default 80) and LR (default 2e-3) override the
# task and schedule (defaults for parity); DRY_RUN=1 only prints train.py's plan; FP8=1 serves a
# block-FP8 copy of the tiny model (make_tiny_model.py --fp8) as --hf-checkpoint, as the FP8=1 GPU
# recipes do (the trainer still starts from the float torch_dist). Extra arguments are appended to
# train.py's flags. Re-running reuses the model, data and torch_dist checkpoint already built and
# resumes the run in RUN_DIR from its last checkpoint (--load = --save, slime's convention; metrics
# rows are appended to metrics.jsonl); pass --overwrite-run to start afresh in the same folder (the
# old metrics.jsonl is kept beside it), or give another SLIME_RUN_DIR. While a run uses RUN_DIR, a
# second launch with the same folder is refused (docs/preflight.md).
set -euo pipefail
# the start-up profile's zero (slime.utils.startup_profile: "startup +Ns <stage>" log lines)
SLIME_START_TIME=${SLIME_START_TIME:-$(date +%s.%N)}
export SLIME_START_TIME

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
REPO_DIR="$(cd -- "${SCRIPT_DIR}/.." &>/dev/null && pwd)"
cd "${REPO_DIR}"

# shellcheck disable=SC1091
source scripts/lib/venv.sh
ensure_venv

TASK=${TASK:-parity}
# per task: reward type and response length (see the header)
case "${TASK}" in
   parity) RM_TYPE=math; MAX_RESPONSE_LEN=1; DEFAULT_RUN_DIR=runs/tiny-moe-cpu
      DEFAULT_NUM_ROLLOUT=80; DEFAULT_LR=2e-3; ENTROPY_COEF=0.0 ;;
   parity_twice) RM_TYPE=char_match; MAX_RESPONSE_LEN=3; DEFAULT_RUN_DIR=runs/tiny-moe-cpu-parity_twice
      DEFAULT_NUM_ROLLOUT=200; DEFAULT_LR=2e-3; ENTROPY_COEF=0.03 ;;
   *) echo "TASK=${TASK}: expected parity or parity_twice" >&2; exit 2 ;;
esac
MODEL_VARIANT=${MODEL_VARIANT:-moe}
# the make_tiny_model.py variant's MODEL_ARGS (its family module in slime/models/ names the script)
MODEL_SCRIPT=$(python tools/make_tiny_model.py --variant "${MODEL_VARIANT}" --model-script)
DEFAULT_RUN_DIR=${DEFAULT_RUN_DIR/tiny-moe-cpu/tiny-${MODEL_VARIANT}-cpu}
RUN_DIR=${SLIME_RUN_DIR:-${DEFAULT_RUN_DIR}}
RUN_DIR="$(mkdir -p "${RUN_DIR}" && cd "${RUN_DIR}" && pwd)"
NUM_ROLLOUT=${NUM_ROLLOUT:-${DEFAULT_NUM_ROLLOUT}}
LR=${LR:-${DEFAULT_LR}}
DRY_RUN=${DRY_RUN:-0}

if [ ! -f "${RUN_DIR}/hf/model.safetensors" ]; then
   python tools/make_tiny_model.py --output-dir "${RUN_DIR}/hf" --variant "${MODEL_VARIANT}" --seed 0
fi
# one data folder per task, so switching TASK with the same SLIME_RUN_DIR never reuses stale data
DATA_DIR="${RUN_DIR}/data"
[ "${TASK}" = "parity" ] || DATA_DIR="${RUN_DIR}/data-${TASK}"
if [ ! -f "${DATA_DIR}/eval.jsonl" ]; then
   python tools/make_toy_data.py --output-dir "${DATA_DIR}" --task "${TASK}" --seed 0 --num-train 4096
fi

HF_CHECKPOINT="${RUN_DIR}/hf"
if [ "${FP8:-0}" = "1" ]; then
   HF_CHECKPOINT="${RUN_DIR}/hf_fp8"
   if [ ! -f "${HF_CHECKPOINT}/model.safetensors" ]; then
      python tools/make_tiny_model.py --output-dir "${HF_CHECKPOINT}" --variant "${MODEL_VARIANT}" --seed 0 --fp8
   fi
fi

source "scripts/models/${MODEL_SCRIPT}"

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
   --hf-checkpoint "${HF_CHECKPOINT}"
   --ref-load "${RUN_DIR}/torch_dist"
   --save "${RUN_DIR}/ckpt"
   "${LOAD_ARGS[@]}"
   --save-hf "${RUN_DIR}/hf_final"
   # halfway and at the end
   --save-interval "$(( (NUM_ROLLOUT + 1) / 2 ))"
)

ROLLOUT_ARGS=(
   --prompt-data "${DATA_DIR}/train.jsonl"
   --input-key prompt
   --label-key label
   --apply-chat-template
   --rollout-shuffle
   --rm-type "${RM_TYPE}"
   --num-rollout "${NUM_ROLLOUT}"
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   # parity: one token, the answer; parity_twice: the answer and <|im_end|> (see the header)
   --rollout-max-response-len "${MAX_RESPONSE_LEN}"
   --rollout-temperature 1.0
   # the response text without <|im_end|>'s text, so char_match sees where the answer ends
   --rollout-skip-special-tokens
   # one optimizer step per rollout
   --global-batch-size 256
)

EVAL_ARGS=(
   --eval-interval 10
   --eval-prompt-data toy "${DATA_DIR}/eval.jsonl"
)

PERF_ARGS=(
   --tensor-model-parallel-size 1
   --expert-model-parallel-size 2
   --use-dynamic-batch-size
   --max-tokens-per-gpu 2048
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --eps-clip 0.2
   --eps-clip-high 0.28
   --use-kl-loss
   --kl-loss-coef 0.0
   --kl-loss-type low_var_kl
   --entropy-coef "${ENTROPY_COEF}"  # per task (see the header)
)

OPTIMIZER_ARGS=(
   --optimizer adam
   # 2e-3 reaches mean reward 0.9 in ~50 steps in tools/check_toy_learnability.py; 1e-3 needs
   # over 100. Once nearly every group is all-correct (zero advantage), Adam can take one large
   # step and lose the policy (seen in 1 of 4 seeds, at step 70): judge a run by its best window.
   --lr "${LR}"
   --lr-decay-style constant
   --weight-decay 0.0
   --adam-beta1 0.9
   --adam-beta2 0.98
)

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 1
   # each group's 8 samples as one batched /generate to the engine (32 requests a rollout instead
   # of 256 through the router): the same tokens and metrics, generation 0.26-0.27 -> 0.16 s per
   # rollout (median, load 2.5 on 2 cores; docs/performance.md, "One /generate per group")
   --rollout-group-requests
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

echo "[run-tiny-moe-cpu] task: ${TASK}  model: ${MODEL_VARIANT} ${HF_CHECKPOINT}  data: ${DATA_DIR}"
if [ "${DRY_RUN}" = "1" ]; then
   # ---- train.py call, dry run: flags validated and the plan printed; no Ray, no training. ----
   python train.py "${ARGS[@]}" --dry-run "$@"
   echo "[run-tiny-moe-cpu] dry run done (without DRY_RUN=1 it trains); outputs would go to ${RUN_DIR}"
   exit 0
fi
# ---- train.py call, real run (the CPU loop: Ray + Megatron on gloo + local engine). ----
python train.py "${ARGS[@]}" "$@"
python tools/plot_metrics.py --metrics "${RUN_DIR}/metrics.jsonl" --output "${RUN_DIR}/curve.png"
echo "[run-tiny-moe-cpu] done:"
echo "  metrics     ${RUN_DIR}/metrics.jsonl"
echo "  curve       ${RUN_DIR}/curve.png"
echo "  HF policy   ${RUN_DIR}/hf_final"
echo "  checkpoint  ${RUN_DIR}/ckpt"
