#!/usr/bin/env bash
# Create .venv if missing, install slime with its CPU stack (torch 2.13.0 first) and the sglang
# releases of the conformance tier, run the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -k kl`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh
ensure_venv
# The sglang releases tests/conformance/ judges us against (cached outside the clone, by version).
python tests/conformance/releases.py
exec python -m pytest "${@:-tests}"
