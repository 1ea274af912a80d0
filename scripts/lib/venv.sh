# Sourced by the launch and test scripts: make sure .venv exists and holds slime and its CPU stack.
# Idempotent: a stamp with the hash of setup.py skips the install when nothing changed.
# SLIME_NO_VENV=1 uses the current Python as it is instead (a GPU image with its own CUDA torch,
# Transformer Engine and SGLang, which a fresh .venv would not see): nothing is created or installed.
ensure_venv() {
  local root py stamp want
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  if [ "${SLIME_NO_VENV:-0}" = "1" ]; then
    export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
    if ! python -c "import torch, megatron.core, ray, transformers" 2>/dev/null; then
      echo "[slime] SLIME_NO_VENV=1: '$(command -v python || echo python)' cannot import torch, megatron.core, ray" \
        "and transformers; install slime's dependencies into it (pip install -e '.[megatron,router]') or unset SLIME_NO_VENV" >&2
      return 1
    fi
    return 0
  fi
  py="${PYTHON:-python3}"
  if [ ! -x "$root/.venv/bin/python" ]; then
    echo "[slime] creating $root/.venv"
    "$py" -m venv "$root/.venv"
  fi
  # shellcheck disable=SC1091
  source "$root/.venv/bin/activate"
  stamp="$root/.venv/.slime-installed"
  want="$(cat "$root/setup.py" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  echo "[slime] installing into .venv (torch 2.13.0 CPU first, then slime[all-cpu])"
  python -m pip install --quiet --upgrade pip setuptools wheel
  # torch first, pinned, so nothing later pulls a CUDA build from the registry.
  python -m pip install --quiet "torch==2.13.0"
  python -m pip install --quiet -e "$root[all-cpu]"
  echo "$want" > "$stamp"
}
