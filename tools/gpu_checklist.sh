#!/bin/bash
# The first-run checklist of docs/gpu-guide.md (section 11), steps 1, 2 and 4, on a GPU machine, in
# the current Python environment (SLIME_NO_VENV=1: the machine's CUDA torch, and TE / SGLang where
# installed). Logs go to LOG_DIR (default runs/gpu-checklist): versions.log, gpu_tests.log,
# loop.log (with the run's metrics.jsonl and error.log beside it). Steps run in order and a failed
# one does not stop the next. Env: GPUS (default: all visible), NUM_ROLLOUT (default 4),
# STEPS (default "1 2 4"; "3" adds the whole CPU suite, minutes). Every step runs under `timeout`
# (STEP1_TIMEOUT 60 s, STEP2_TIMEOUT 300 s, STEP3_TIMEOUT 1800 s, STEP4_TIMEOUT 600 s): a lent
# machine's minutes are few, and a step that hangs must not take the next steps' time.
# With one GPU the tiny loop runs colocated (trainer and engine share it, EP1); with two or more,
# as on CPU (EP2 trainer on 2 GPUs, one engine GPU) when three are free, else colocated on 2.
set -uo pipefail
cd "$(dirname "$0")/.."
export SLIME_NO_VENV=1 PYTHONUNBUFFERED=1
source scripts/lib/venv.sh
ensure_venv || exit 2
LOG_DIR=${LOG_DIR:-runs/gpu-checklist}
mkdir -p "${LOG_DIR}"
GPUS=${GPUS:-$(python -c "import torch; print(torch.cuda.device_count())")}
STEPS=${STEPS:-1 2 4}
step() { [[ " ${STEPS} " == *" $1 "* ]]; }
if step 1; then
  echo "== 1. versions"
  timeout "${STEP1_TIMEOUT:-60}" python - <<'PY' 2>&1 | tee "${LOG_DIR}/versions.log"
import importlib, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "|", torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA")
for name in ("megatron.core", "ray", "transformers", "transformer_engine", "apex", "sglang", "sglang_router"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:  # a missing package is a finding, not a stop
        print(name, "missing:", type(e).__name__, str(e)[:120])
PY
fi
if step 2; then
  echo "== 2. tests marked gpu"
  timeout "${STEP2_TIMEOUT:-300}" python -m pytest -m gpu -p no:cacheprovider -rfEs --tb=short tests 2>&1 | tee "${LOG_DIR}/gpu_tests.log" | tail -25
fi
if step 3; then
  echo "== 3. the whole suite"
  timeout "${STEP3_TIMEOUT:-1800}" python -m pytest -p no:cacheprovider -rfE --tb=short tests 2>&1 | tee "${LOG_DIR}/suite.log" | tail -40
fi
if step 4; then
  echo "== 4. the tiny loop on the GPU, local engine (${GPUS} GPUs)"
  if [ "${GPUS}" -ge 3 ]; then LAYOUT=()
  elif [ "${GPUS}" -eq 2 ]; then LAYOUT=(--colocate)
  else LAYOUT=(--colocate --actor-num-gpus-per-node 1 --expert-model-parallel-size 1); fi
  SLIME_RUN_DIR="${LOG_DIR}/loop" NUM_ROLLOUT=${NUM_ROLLOUT:-4} timeout "${STEP4_TIMEOUT:-600}" bash scripts/run-tiny-moe-cpu.sh --overwrite-run \
    --distributed-backend nccl --rollout-engine local --eval-interval 2 "${LAYOUT[@]}" > "${LOG_DIR}/loop.log" 2>&1
  echo "loop exit code $?"
  grep -E "startup \+|rollout [0-9]+/|job failed" "${LOG_DIR}/loop.log" | tail -20
fi
