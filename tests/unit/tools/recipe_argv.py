"""The flags a launch script passes train.py, verbatim, read by running the script itself.

`recipe_argv` runs ``scripts/<script> --dry-run`` with ``PYTHON`` pointing at a recorder that writes
its arguments instead of running train.py, so a test gets exactly the script's flags (nothing added,
nothing dropped; only the environment, e.g. ``MODEL_DIR``, is chosen).
"""

import os
import subprocess


def recipe_argv(repo_root, script: str, tmp_path, **env) -> tuple[str, list[str]]:
    """(entry, flags) that ``scripts/<script> --dry-run`` hands its Python (entry: train.py or
    train_async.py); ``env`` is added to the environment (defaults: MODEL_DIR=/root as the script)."""
    record, recorder = tmp_path / "argv", tmp_path / "record-python"
    recorder.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > "{record}"\n')
    recorder.chmod(0o755)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("WANDB_KEY", "WANDB_API_KEY", "DP_ATTN", "FP8", "COLOCATE", "ASYNC", "MODEL_DIR")}
    subprocess.run(["bash", str(repo_root / "scripts" / script), "--dry-run"],
                   env={**clean, **env, "PYTHON": str(recorder)}, check=True, timeout=60)
    entry, *flags = record.read_text().split("\0")[:-1]
    return os.path.basename(entry).removesuffix(".py"), flags
