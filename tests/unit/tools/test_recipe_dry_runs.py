"""Every launch script's `--dry-run`, with the script's flags verbatim, builds megatron-core's config
objects as the GPU run would and is clean; a combination megatron-core refuses is refused by the dry
run in one line naming the flags, exit 2.

The scripts run for real (bash, then train.py); only the environment is chosen: MODEL_DIR is left
unset (missing files are dry-run warnings) or, for the DeepSeek-V3 and GLM-4.5 families, holds the
released config.json (tests/data/hf-configs) where the script looks for it (the HF cross-check of MODEL_ARGS runs and the
plan counts the published sizes); the optional switches (FP8, DP_ATTN, COLOCATE, ASYNC, wandb keys)
are unset, as on a fresh node.
"""

import os
import shutil
import subprocess

import pytest

from tests.warm_python import warm_python

# run script -> None, or (HF folder it reads = its folder in tests/data/hf-configs, "total" and "active"
# as the plan prints them)
GPU_RECIPES = {
    "run-deepseek-v3.sh": ("DeepSeek-V3", "671.026 B total", "37.552 B active"),
    "run-kimi-k2.sh": ("Kimi-K2-Instruct", "1026.408 B total", "32.861 B active"),
    "run-moonlight-16B-A3B.sh": ("Moonlight-16B-A3B-Instruct", "15.960 B total", "2.915 B active"),
    "run-glm4.5-355B-A32B.sh": ("GLM-4.5", "352.798 B total", "33.632 B active"),
    "run-glm4.5-106B-A12B.sh": ("GLM-4.5-Air", "106.852 B total", "13.424 B active"),
    "run-qwen3-0.6B.sh": None,
    "run-qwen3-4B.sh": None,
    "run-qwen3-30B-A3B.sh": None,
}
# scripts/run-tiny-moe-cpu.sh builds a tiny model and data first; its dry run (with the configs
# built) is checked in tests/unit/tools/test_run_tiny_moe_cpu.py.
CPU_RECIPES = ["run-tiny-moe-cpu.sh"]


def dry_run(repo_root, script, *extra, model_dir=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("WANDB_KEY", "WANDB_API_KEY", "DP_ATTN", "FP8", "COLOCATE", "ASYNC", "MODEL_DIR")}
    env |= {"MODEL_DIR": str(model_dir)} if model_dir else {}
    return subprocess.run(["bash", str(repo_root / "scripts" / script), "--dry-run", *extra],
                          env={**env, "PYTHON": warm_python()}, capture_output=True, text=True, timeout=300)


def configs_section(out: str) -> str:
    assert "== megatron-core configs" in out, out[-3000:]
    return out.split("== megatron-core configs")[1].split("\n\n")[0]


def test_every_launch_script_is_covered(repo_root):
    assert sorted(p.name for p in (repo_root / "scripts").glob("run-*.sh")) == sorted([*GPU_RECIPES, *CPU_RECIPES])


@pytest.mark.parametrize("script", GPU_RECIPES)
def test_recipe_dry_run_builds_megatron_configs(repo_root, tmp_path, script):
    release = GPU_RECIPES[script]
    if release:
        (tmp_path / release[0]).mkdir()
        shutil.copyfile(repo_root / "tests" / "data" / "hf-configs" / release[0] / "config.json",
                        tmp_path / release[0] / "config.json")  # the released file, verbatim
    proc = dry_run(repo_root, script, model_dir=tmp_path if release else None)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    if release:
        out = proc.stdout + proc.stderr
        assert release[1] in out and release[2] in out, out[-3000:]
        assert "cross-check of MODEL_ARGS skipped" not in out and "does not match" not in out
        assert "trainer verdict             : fits" in out and "engine verdict              : fits" in out
    assert "error" not in proc.stderr.lower().replace("errors", ""), proc.stderr[-2000:]
    section = configs_section(proc.stdout)
    transformer = next(line for line in section.splitlines() if "TransformerConfig" in line)
    # the GPU run's values: bf16 and every fusion on that the recipe does not turn off
    text = (repo_root / "scripts" / script).read_text()
    assert "torch.bfloat16" in transformer and "masked_softmax_fusion" in transformer, section
    assert ("apply_rope_fusion" in transformer) == ("--no-rope-fusion" not in text), section
    assert "gradient_accumulation_fusion" in transformer and "fused_weight_gradient_mlp_cuda" in section
    assert "actor OptimizerConfig" in section and "distributed optimizer True" in section
    assert "actor DDP config" in section
    if "--use-precision-aware-optimizer" in text:
        assert "precision-aware True" in section


@pytest.mark.parametrize("extra, flags, says", [
    # OptimizerConfig: the precision-aware optimizer is Adam's only
    (["--optimizer", "sgd"], "--use-precision-aware-optimizer", "only supported with adam"),
    # TransformerConfig: aux-loss-free expert bias needs the sigmoid router (the recipe's is softmax)
    (["--moe-router-enable-expert-bias"], "--moe-router-score-function", "only supports sigmoid"),
])
def test_dry_run_refuses_what_megatron_core_refuses(repo_root, tmp_path, extra, flags, says):
    proc = dry_run(repo_root, "run-qwen3-30B-A3B.sh", *extra)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"train.py: error: {flags}: megatron-core refuses"), errors
    assert says in errors[0]
    assert "== Placement" not in proc.stdout  # refused before the plan
