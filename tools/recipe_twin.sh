#!/bin/bash
# CPU twins of the GPU recipes: each scripts/run-NAME.sh runs its own flags with a tiny model of its
# family, on gloo ranks, for two rollouts, a save and a resume (tools/recipe_twin.py says how).
#
#   tools/recipe_twin.sh NAME [NAME ...]   # e.g. qwen3-30B-A3B (scripts/run-qwen3-30B-A3B.sh)
#   tools/recipe_twin.sh all               # every scripts/run-*.sh but the CPU recipe run-tiny-moe-cpu.sh
#
# Prints each twin's wall time and, for a failing twin, its first error; exits 1 if any failed.
# Env: TWIN_MAX_RANKS (default 8) caps the gloo ranks of one twin; TWIN_WORK_DIR (default
# runs/twins) holds one folder per twin (logs, tiny checkpoints, data), emptied at its start.
# Twins run one after the other: 8 trainer ranks and an engine already fill a small machine.
set -euo pipefail

REPO_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." &>/dev/null && pwd)"
cd "${REPO_DIR}"
# shellcheck disable=SC1091
source scripts/lib/venv.sh
ensure_venv
export PYTHONPATH="${REPO_DIR}"

if [ "$#" -eq 0 ]; then
   sed -n '2,10p' "$0" >&2
   exit 2
fi
NAMES=("$@")
if [ "$1" = "all" ]; then
   NAMES=()
   for script in scripts/run-*.sh; do
      name="$(basename "${script}" .sh)"
      name="${name#run-}"
      [ "${name}" = "tiny-moe-cpu" ] || NAMES+=("${name}")
   done
fi

WORK_DIR=${TWIN_WORK_DIR:-runs/twins}
mkdir -p "${WORK_DIR}"
SUMMARY=()
FAILED=0
for name in "${NAMES[@]}"; do
   log="${WORK_DIR}/${name}.log"
   start=$(date +%s)
   status=0
   python tools/recipe_twin.py "${name}" --max-ranks "${TWIN_MAX_RANKS:-8}" --work-dir "${WORK_DIR}" \
      2>&1 | tee "${log}" || status=$?
   seconds=$(( $(date +%s) - start ))
   if [ "${status}" -eq 0 ]; then
      SUMMARY+=("$(printf '%-20s PASSED %5d s' "${name}" "${seconds}")")
   else
      FAILED=1
      error="$(grep -m1 'FAILED after' "${log}" || tail -n1 "${log}")"
      SUMMARY+=("$(printf '%-20s FAILED %5d s  %s' "${name}" "${seconds}" "${error#*FAILED after * s: }")")
   fi
done

echo
echo "== recipe twins (log per twin in ${WORK_DIR}/NAME.log, run logs in ${WORK_DIR}/NAME/) =="
printf '%s\n' "${SUMMARY[@]}"
exit "${FAILED}"
