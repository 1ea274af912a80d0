#!/bin/bash
# Soak test of the README's main command: clone this repository's committed HEAD into N fresh
# folders, one after the other, and run `bash scripts/run-tiny-moe-cpu.sh` in each, as a user
# would on a fresh machine (each clone creates its own .venv; pip's cache keeps that quick).
#
# Usage: bash tools/soak.sh N
# Reports, per run: pass/fail, wall time, the best `rollout/raw_reward` and the last `eval/toy`
# read from the run's metrics.jsonl; then the pass count and, for the first failure, the last
# lines of its log. Exits 1 if any run failed (a non-zero exit of the command).
# Env: SOAK_DIR (default: a new folder under ${TMPDIR:-/tmp}) holds the clones and logs;
# SOAK_KEEP=1 keeps the clones of passing runs (default: deleted, logs kept; a failing run's clone
# is always kept); SOAK_COMMAND replaces the command run in each clone (default: the README's);
# SOAK_TAIL lines of the failure's log to print (default 40). Other variables (NUM_ROLLOUT, LR,
# TASK, ...) reach the command unchanged.
set -euo pipefail

if [ "$#" -ne 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
   echo "usage: bash tools/soak.sh N   (N >= 1 runs)" >&2
   exit 2
fi
RUNS=$1
REPO="$(git -C "$(dirname -- "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)"
HEAD="$(git -C "${REPO}" rev-parse HEAD)"
SOAK_DIR=${SOAK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/slime-soak.XXXXXX")}
SOAK_COMMAND=${SOAK_COMMAND:-bash scripts/run-tiny-moe-cpu.sh}
SOAK_TAIL=${SOAK_TAIL:-40}
mkdir -p "${SOAK_DIR}"
echo "[soak] ${RUNS} run(s) of '${SOAK_COMMAND}' on ${REPO} at ${HEAD:0:12}, in ${SOAK_DIR}"
if [ -n "$(git -C "${REPO}" status --porcelain --untracked-files=no)" ]; then
   echo "[soak] note: ${REPO} has uncommitted changes; the clones run the committed HEAD only"
fi

# metrics.jsonl -> "best_reward=X last_eval=Y" (or "no metrics")
summarize_metrics() {
   # the main script's run folder: SLIME_RUN_DIR, or its default for TASK (relative to the clone)
   local run_dir="runs/tiny-moe-cpu"
   [ "${TASK:-parity}" = "parity" ] || run_dir="runs/tiny-moe-cpu-${TASK}"
   run_dir="${SLIME_RUN_DIR:-${run_dir}}"
   [[ "${run_dir}" = /* ]] || run_dir="$1/${run_dir}"
   local metrics="${run_dir}/metrics.jsonl"
   if [ ! -f "${metrics}" ]; then
      echo "no metrics"
      return
   fi
   python3 - "${metrics}" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
rewards = [r["rollout/raw_reward"] for r in rows if "rollout/raw_reward" in r]
evals = [v for r in rows for k, v in r.items() if k.startswith("eval/") and "/" not in k[5:]]
best = f"{max(rewards):.3f}" if rewards else "-"
last = f"{evals[-1]:.3f}" if evals else "-"
print(f"rollouts={len(rewards)} best_reward={best} last_eval={last}")
EOF
}

passes=0
first_failure=""
report=()
for i in $(seq 1 "${RUNS}"); do
   clone="${SOAK_DIR}/run${i}"
   log="${SOAK_DIR}/run${i}.log"
   git clone --quiet "${REPO}" "${clone}"
   git -C "${clone}" checkout --quiet --detach "${HEAD}"
   start=$(date +%s)
   set +e
   (cd "${clone}" && eval "${SOAK_COMMAND}") >"${log}" 2>&1
   code=$?
   set -e
   seconds=$(( $(date +%s) - start ))
   summary="$(summarize_metrics "${clone}")"
   if [ "${code}" -eq 0 ]; then
      passes=$((passes + 1))
      verdict=pass
      [ "${SOAK_KEEP:-0}" = "1" ] || rm -rf "${clone}"
   else
      verdict="FAIL (exit ${code})"
      [ -n "${first_failure}" ] || first_failure="${log}"
   fi
   line="run ${i}/${RUNS}: ${verdict} in ${seconds}s, ${summary}, log ${log}"
   report+=("${line}")
   echo "[soak] ${line}"
done

echo "[soak] ${passes}/${RUNS} passed"
for line in "${report[@]}"; do echo "[soak]   ${line}"; done
if [ -n "${first_failure}" ]; then
   echo "[soak] first failure: ${first_failure} (last ${SOAK_TAIL} lines):"
   tail -n "${SOAK_TAIL}" "${first_failure}"
   exit 1
fi
