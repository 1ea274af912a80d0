"""``scripts/run-qwen3-30B-A3B.sh --dry-run`` prints the plan through train.py without Ray."""

import os
import re
import subprocess

import pytest

from tests.unit.utils.plan.conftest import REPO
from tests.warm_python import warm_python


def _dry_run(*extra, **env):
    inherited = {k: v for k, v in os.environ.items() if k not in ("WANDB_KEY", "WANDB_API_KEY", "DP_ATTN", "FP8")}
    full_env = dict(inherited, PYTHON=warm_python(), MODEL_DIR="/nonexistent-models", **env)
    return subprocess.run(["bash", "scripts/run-qwen3-30B-A3B.sh", "--dry-run", *extra], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=120)


def _line(text, key):
    match = re.search(rf"^\s*{key}\s*: (.*)$", text, re.MULTILINE)
    assert match, f"no '{key}' line in:\n{text}"
    return match.group(1)


def test_dry_run_recipe_fits_on_one_node():
    proc = _dry_run(WANDB_KEY="do-not-print-me")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert _line(out, "trainer verdict").startswith("fits")
    assert _line(out, "engine verdict") == "fits"
    assert "455.54 GiB" in _line(out, "per node")
    assert _line(out, "engines").startswith("1 x 8 GPUs (tp 8, dp-attention 1, ep 8)")
    assert "do-not-print-me" not in out + proc.stderr
    assert "--wandb-key" not in out + proc.stderr  # the key went by environment (no warning about the flag)


def test_dry_run_options_and_extra_flags():
    proc = _dry_run("--host-memory-gib", "256", DP_ATTN="1", FP8="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "dp-attention 8" in _line(out, "engines")
    assert "fp8" in _line(out, "weights per GPU")
    assert _line(out, "host verdict").startswith("OVER BUDGET")


@pytest.mark.parametrize("fp8", ["0", "1"])
def test_dry_run_with_sglang_engines_shows_the_colocated_hand_over(fp8):
    proc = _dry_run("--rollout-engine", "sglang", FP8=fp8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert _line(out, "mode").startswith("colocated")
    assert "trainer offloads optimizer + grads -> engines resume weights" in _line(out, "hand-over per rollout")
    phases = re.findall(r"^\s*\d\. (.*?)\s*: .*\n(?:.*\n)*?\s*verdict\s*: (.*)$", out, re.MULTILINE)
    assert [name.split(" (")[0] for name, _ in phases] == ["train", "weight sync", "rollout"]
    assert all(v.startswith("fits") and "of 80.0 GiB" in v for _, v in phases), phases
    assert ("fp8" in _line(out, "weights per GPU")) == (fp8 == "1")


def test_dry_run_on_four_gpus_is_refused_with_the_reason():
    proc = _dry_run("--rollout-engine", "sglang", "--actor-num-gpus-per-node", "4")
    assert proc.returncode != 0
    assert ("--rollout-num-gpus 4 (with --colocate: the trainer's GPUs) is not divisible by "
            "--rollout-num-gpus-per-engine 8") in proc.stderr


def test_dry_run_exit_status_follows_train_py():
    proc = _dry_run("--tensor-model-parallel-size", "3")
    assert proc.returncode != 0
    assert "--tensor-model-parallel-size" in proc.stderr


@pytest.mark.parametrize("script", ["scripts/run-qwen3-30B-A3B.sh", "scripts/models/qwen3-30B-A3B.sh"])
def test_scripts_parse_as_bash(script):
    assert subprocess.run(["bash", "-n", script], cwd=REPO).returncode == 0
