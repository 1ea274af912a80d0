#!/bin/bash
# On-policy distillation on CPU: a fresh tiny MoE student (seed 0) samples answers to the toy
# parity task; a teacher (the same tiny MoE after GRPO on that task, scripts/run-tiny-moe-cpu.sh)
# served by a second local engine scores each response token with its log-probs; the advantage is
# the GRPO advantage minus OPD_KL_COEF * (student - teacher log-prob) per token (--use-opd
# --opd-type sglang). See README.md in this folder for the numbers seen.
#
# Env: TEACHER_DIR (default runs/tiny-moe-cpu: a finished run of scripts/run-tiny-moe-cpu.sh; its
# hf_final/ is the teacher; when missing, that script is run first with NUM_ROLLOUT=${TEACHER_ROLLOUTS:-60}),
# SLIME_RUN_DIR (default runs/opd-tiny-cpu), NUM_ROLLOUT (default 30), OPD_KL_COEF (default 1.0;
# 0 keeps plain GRPO while still measuring the reverse KL: the control run), LR (default 2e-3),
# DISTILL_ONLY=1 (train on the teacher alone: the training reward is 0 for every sample, so GRPO
# advantages are 0; eval/toy still reports the task score; see rewards.py).
# Extra arguments are appended to train.py's flags. The run starts afresh each time (--overwrite-run).
# Outputs: SLIME_RUN_DIR/metrics.jsonl (train/opd_reverse_kl, rollout/raw_reward, eval/toy each 10
# rollouts), teacher_engine.log.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
REPO_DIR="$(cd -- "${SCRIPT_DIR}/../.." &>/dev/null && pwd)"
cd "${REPO_DIR}"

# shellcheck disable=SC1091
source scripts/lib/venv.sh
ensure_venv
export PYTHONPATH="${REPO_DIR}${PYTHONPATH:+:${PYTHONPATH}}"

TEACHER_DIR=${TEACHER_DIR:-runs/tiny-moe-cpu}
RUN_DIR=${SLIME_RUN_DIR:-runs/opd-tiny-cpu}
RUN_DIR="$(mkdir -p "${RUN_DIR}" && cd "${RUN_DIR}" && pwd)"
NUM_ROLLOUT=${NUM_ROLLOUT:-30}
OPD_KL_COEF=${OPD_KL_COEF:-1.0}
LR=${LR:-2e-3}

# ---- the teacher: the tiny MoE trained on the task (built once) ----
if [ ! -f "${TEACHER_DIR}/hf_final/model.safetensors" ]; then
   echo "[opd] no teacher at ${TEACHER_DIR}/hf_final: training it with scripts/run-tiny-moe-cpu.sh"
   SLIME_RUN_DIR="${TEACHER_DIR}" NUM_ROLLOUT="${TEACHER_ROLLOUTS:-60}" bash scripts/run-tiny-moe-cpu.sh
fi
TEACHER_HF="$(cd "${TEACHER_DIR}/hf_final" && pwd)"

# ---- the student: a fresh tiny MoE (the teacher's starting point) and the task's data ----
if [ ! -f "${RUN_DIR}/hf/model.safetensors" ]; then
   python tools/make_tiny_model.py --output-dir "${RUN_DIR}/hf" --variant moe --seed 0
fi
if [ ! -f "${RUN_DIR}/data/eval.jsonl" ]; then
   python tools/make_toy_data.py --output-dir "${RUN_DIR}/data" --task parity --seed 0 --num-train 4096
fi
source scripts/models/qwen3-tiny-moe.sh
if [ ! -f "${RUN_DIR}/torch_dist/latest_checkpointed_iteration.txt" ]; then
   python tools/convert_hf_to_torch_dist.py "${MODEL_ARGS[@]}" --hf-checkpoint "${RUN_DIR}/hf" --save "${RUN_DIR}/torch_dist"
fi

# ---- the teacher's engine: started here, stopped on exit (only this process) ----
TEACHER_PORT=$(python -c "from slime.utils.misc import free_port; print(free_port())")
python -m slime.backends.local_engine --model-path "${TEACHER_HF}" --port "${TEACHER_PORT}" --num-threads 1 \
   > "${RUN_DIR}/teacher_engine.log" 2>&1 &
TEACHER_PID=$!
trap 'kill "${TEACHER_PID}" 2>/dev/null || true; wait "${TEACHER_PID}" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
   curl -sf "http://127.0.0.1:${TEACHER_PORT}/health" >/dev/null && break
   kill -0 "${TEACHER_PID}" 2>/dev/null || { echo "[opd] the teacher engine died; see ${RUN_DIR}/teacher_engine.log" >&2; exit 1; }
   sleep 1
done
curl -sf "http://127.0.0.1:${TEACHER_PORT}/health" >/dev/null || { echo "[opd] the teacher engine did not come up" >&2; exit 1; }

OPD_ARGS=(
   --use-opd
   --opd-type sglang
   --opd-teacher-url "http://127.0.0.1:${TEACHER_PORT}"
   --opd-kl-coef "${OPD_KL_COEF}"
)

REWARD_ARGS=(--rm-type math)
if [ "${DISTILL_ONLY:-0}" = "1" ]; then
   REWARD_ARGS=(--custom-rm-path examples.on_policy_distillation.rewards.distill_only
                --reward-key train --eval-reward-key task)
fi

ARGS=(
   --actor-num-nodes 1 --actor-num-gpus-per-node 2 --rollout-num-gpus 1 --rollout-num-gpus-per-engine 1
   "${MODEL_ARGS[@]}"
   --hf-checkpoint "${RUN_DIR}/hf" --ref-load "${RUN_DIR}/torch_dist" --save "${RUN_DIR}/ckpt" --overwrite-run
   --prompt-data "${RUN_DIR}/data/train.jsonl" --input-key prompt --label-key label --apply-chat-template
   --rollout-shuffle "${REWARD_ARGS[@]}"
   --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size 32 --n-samples-per-prompt 8
   --rollout-max-response-len 1 --rollout-temperature 1.0 --global-batch-size 256
   --eval-interval 10 --eval-prompt-data toy "${RUN_DIR}/data/eval.jsonl"
   --tensor-model-parallel-size 1 --expert-model-parallel-size 2 --use-dynamic-batch-size --max-tokens-per-gpu 2048
   --advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28
   "${OPD_ARGS[@]}"
   --optimizer adam --lr "${LR}" --lr-decay-style constant --weight-decay 0.0 --adam-beta1 0.9 --adam-beta2 0.98
   --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32
   --distributed-backend gloo --seed 1234 --metrics-dir "${RUN_DIR}"
)

echo "[opd] teacher ${TEACHER_HF} at :${TEACHER_PORT}; student ${RUN_DIR}/hf; --opd-kl-coef ${OPD_KL_COEF}; distill only: ${DISTILL_ONLY:-0}"
python train.py "${ARGS[@]}" "$@"
python - "${RUN_DIR}/metrics.jsonl" <<'EOF'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
train = [r for r in rows if "train/opd_reverse_kl" in r]
print("[opd] rollout  reverse_kl  raw_reward")
for r in train[:3] + train[-3:]:
    print(f"[opd] {r['rollout_id']:7d}  {r['train/opd_reverse_kl']:10.3f}  {r['rollout/raw_reward']:10.3f}")
evals = [(r["rollout_id"], r["eval/toy"]) for r in rows if "eval/toy" in r]
print("[opd] eval/toy:", ", ".join(f"{i}: {v:.3f}" for i, v in evals))
EOF
