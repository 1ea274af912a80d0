"""GPU recipes of the DeepSeek-V3 (DeepSeek-V3/R1, Kimi-K2, Moonlight) and GLM-4.5 families:
scripts/run-*.sh --dry-run, run for real against the released config.json (placed where the script
looks for it, so the HF cross-check of MODEL_ARGS runs), prints a plan whose parameter counts are
the published model sizes and whose layouts fit."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.unit.tools.test_model_scripts import released_config

# (run script, HF folder it reads = its folder in tests/data/hf-configs, "total" and "active" as the plan prints them)
RECIPES = [
    ("run-deepseek-v3.sh", "DeepSeek-V3", "671.026 B total", "37.552 B active"),
    ("run-kimi-k2.sh", "Kimi-K2-Instruct", "1026.408 B total", "32.861 B active"),
    ("run-moonlight-16B-A3B.sh", "Moonlight-16B-A3B-Instruct", "15.960 B total", "2.915 B active"),
    ("run-glm4.5-355B-A32B.sh", "GLM-4.5", "352.798 B total", "33.632 B active"),
    ("run-glm4.5-106B-A12B.sh", "GLM-4.5-Air", "106.852 B total", "13.424 B active"),
]


@pytest.mark.parametrize("script, folder, total, active", RECIPES, ids=[r[0] for r in RECIPES])
def test_family_recipe_dry_run(repo_root, tmp_path, script, folder, total, active):
    (tmp_path / folder).mkdir()
    shutil.copyfile(repo_root / "tests" / "data" / "hf-configs" / folder / "config.json",
                    tmp_path / folder / "config.json")  # the released file, verbatim
    proc = subprocess.run(["bash", str(repo_root / "scripts" / script), "--dry-run"],
                          env={**os.environ, "PYTHON": sys.executable, "MODEL_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert total in out and active in out, out[-3000:]
    assert "cross-check of MODEL_ARGS skipped" not in out and "does not match" not in out
    assert "trainer verdict             : fits" in out and "engine verdict              : fits" in out


def test_recipe_refuses_mismatched_config(repo_root, tmp_path):
    """The HF cross-check catches a recipe pointed at another model's config (here MLA ranks)."""
    (tmp_path / "DeepSeek-V3").mkdir()
    (tmp_path / "DeepSeek-V3" / "config.json").write_text(json.dumps({**released_config(repo_root, "DeepSeek-V3"), "kv_lora_rank": 256}))
    proc = subprocess.run(["bash", str(repo_root / "scripts" / "run-deepseek-v3.sh"), "--dry-run"],
                          env={**os.environ, "PYTHON": sys.executable, "MODEL_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--kv-lora-rank 512 does not match HF config kv_lora_rank=256" in proc.stdout + proc.stderr
