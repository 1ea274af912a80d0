"""GPU recipes of the DeepSeek-V3 (DeepSeek-V3/R1, Kimi-K2, Moonlight) and GLM-4.5 families: the HF
cross-check of `--dry-run` refuses a recipe pointed at another model's config. (Each recipe's dry run
against its released config.json, the published sizes and the megatron-core configs built from it
are checked in tests/unit/tools/test_recipe_dry_runs.py.)"""

import json
import os
import subprocess

from tests.unit.tools.test_model_scripts import released_config
from tests.warm_python import warm_python


def test_recipe_refuses_mismatched_config(repo_root, tmp_path):
    """The HF cross-check catches a recipe pointed at another model's config (here MLA ranks)."""
    (tmp_path / "DeepSeek-V3").mkdir()
    (tmp_path / "DeepSeek-V3" / "config.json").write_text(json.dumps({**released_config(repo_root, "DeepSeek-V3"), "kv_lora_rank": 256}))
    proc = subprocess.run(["bash", str(repo_root / "scripts" / "run-deepseek-v3.sh"), "--dry-run"],
                          env={**os.environ, "PYTHON": warm_python(), "MODEL_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--kv-lora-rank 512 does not match HF config kv_lora_rank=256" in proc.stdout + proc.stderr
