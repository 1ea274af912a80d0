"""Fixtures for the plan tests: the Qwen3-30B-A3B recipe parsed by the real ``parse_args``.

MODEL_ARGS are read from ``scripts/models/qwen3-30B-A3B.sh`` by bash itself, so the script and the
tests cannot drift apart; the run flags mirror ``scripts/run-qwen3-30B-A3B.sh``.
"""

import subprocess
from pathlib import Path

import pytest

from slime.utils.arguments import parse_args

REPO = Path(__file__).resolve().parents[4]

RUN_ARGS = (
    "--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate "
    "--tensor-model-parallel-size 4 --sequence-parallel --pipeline-model-parallel-size 1 "
    "--context-parallel-size 1 --expert-model-parallel-size 8 --expert-tensor-parallel-size 1 "
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
    "--use-dynamic-batch-size --max-tokens-per-gpu 8192 "
    "--optimizer adam --lr 1e-6 --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d "
    "--use-precision-aware-optimizer "
    "--rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 "
    "--rollout-max-response-len 8192 --num-rollout 3000 "
    "--rollout-num-gpus-per-engine 8 --sglang-mem-fraction-static 0.7 --sglang-ep-size 8 "
    "--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 "
    "--attention-softmax-in-fp32 --attention-backend flash --bf16 "
    "--hf-checkpoint /nonexistent/Qwen3-30B-A3B --dry-run"
).split()

CPU_ADAM_FLAGS = ("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d")


def model_args() -> list[str]:
    """MODEL_ARGS exactly as the model script defines them (one array item per line)."""
    out = subprocess.run(
        ["bash", "-c", 'set -euo pipefail; source scripts/models/qwen3-30B-A3B.sh; printf "%s\\n" "${MODEL_ARGS[@]}"'],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout
    return out.splitlines()


@pytest.fixture(scope="session")
def qwen3_model_args():
    return model_args()


@pytest.fixture
def qwen3_args(qwen3_model_args):
    """Build parsed args for the recipe; ``drop`` removes flags, ``extra`` appends flags."""

    def make(drop=(), extra=()):
        run = [a for a in RUN_ARGS if a not in drop]
        return parse_args(qwen3_model_args + run + list(extra))

    return make
