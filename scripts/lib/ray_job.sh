# Sourced by the GPU run scripts: run the entry point as a Ray job, or print its plan.
#
#   run_train_job ENTRY "${TRAIN_ARGS[@]}"
#
# With --dry-run among the flags, ENTRY runs directly (no Ray) and the script exits with its
# status. Otherwise a Ray head is started on this node unless one already answers at
# ${MASTER_ADDR:-127.0.0.1}:6379, the job is submitted with `ray job submit`, and at exit only a
# Ray started here is stopped. Needs REPO_DIR and PYTHON.
# With SLIME_TWIN_ARGV=FILE (set by tools/recipe_twin.py), nothing runs: ENTRY and the flags are
# written to FILE and the recipe's MODEL_ARGS to FILE.model (NUL-separated), so a recipe's CPU twin
# takes its flags from the recipe script itself.
# Secrets (WANDB_API_KEY) are never put in the runtime env or on a command line, which Ray records
# and ps shows: the job's driver inherits the environment of the Ray head (`ray start` below), so
# export them before this runs; a Ray already running must have been started with them.
# The Ray head started here: on one node (MASTER_ADDR unset) all of Ray's servers on loopback
# (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which the job's driver inherits), dashboard on 127.0.0.1
# (the job is submitted through it), no Prometheus exporter (RAY_enable_metrics_collection=0: it would listen on every interface without
# authentication; the job reads no Ray metrics), and its token file readable by its owner only
# (Ray writes ~/.ray/auth_token 0644; whoever reads it joins the cluster). See docs/security.md.

# Ray's token file: created 0600 when absent (Ray's format: 64 hex characters), else made 0600.
private_ray_token() {
   local token="${RAY_AUTH_TOKEN_PATH:-${HOME}/.ray/auth_token}"
   if [ ! -e "${token}" ]; then
      (umask 077 && mkdir -p "$(dirname "${token}")" \
         && "${PYTHON}" -c 'import secrets; print(secrets.token_hex(32), end="")' > "${token}")
   fi
   chmod go-rwx "${token}"
}

run_train_job() {
   local entry="$1"
   shift
   if [ -n "${SLIME_TWIN_ARGV:-}" ]; then
      printf '%s\0' "${entry}" "$@" >"${SLIME_TWIN_ARGV}"
      printf '%s\0' "${MODEL_ARGS[@]}" >"${SLIME_TWIN_ARGV}.model"
      exit 0
   fi
   local arg
   for arg in "$@"; do
      if [ "${arg}" = "--dry-run" ]; then
         cd "${REPO_DIR}"
         local status=0
         "${PYTHON}" "${entry}" "$@" || status=$?
         exit "${status}"
      fi
   done

   # Ray 2.60's `ray start` turns token authentication on, but its CLI sends the token only under
   # RAY_AUTH_MODE=token: without it `ray status` fails (and a running Ray looks absent) and
   # `ray job submit` answers "Missing authentication token".
   export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
   # One node (no MASTER_ADDR): Ray's single-machine mode keeps 127.0.0.1 as the node's address, so
   # all of Ray's servers bind loopback (else Ray takes the node's IP and every interface); every
   # Ray command here needs it (else it, too, takes 127.0.0.1 for the node's IP).
   if [ -z "${MASTER_ADDR:-}" ]; then export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0; fi
   RAY_STARTED=0
   trap '[ "${RAY_STARTED}" = "1" ] && ray stop' EXIT
   if ! ray status --address "${MASTER_ADDR:-127.0.0.1}:6379" &>/dev/null; then
      private_ray_token
      RAY_enable_metrics_collection=0 ray start --head --node-ip-address "${MASTER_ADDR:-127.0.0.1}" \
         --dashboard-host 127.0.0.1 --num-gpus 8 --disable-usage-stats
      RAY_STARTED=1
   elif [ -e "${RAY_AUTH_TOKEN_PATH:-${HOME}/.ray/auth_token}" ]; then
      private_ray_token
   fi
   if [ "${RAY_STARTED}" = "0" ] && [ -n "${WANDB_API_KEY:-}" ]; then
      echo "[ray_job] Ray already runs: the job sees WANDB_API_KEY only if that Ray was started with it" >&2
   fi

   local runtime_env="{
  \"env_vars\": {
    \"PYTHONPATH\": \"${REPO_DIR}\",
    \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\"
  }
}"
   ray job submit --address="http://127.0.0.1:8265" \
      --runtime-env-json="${runtime_env}" \
      -- "${PYTHON}" "${REPO_DIR}/${entry}" "$@"
}
