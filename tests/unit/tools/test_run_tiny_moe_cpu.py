"""scripts/run-tiny-moe-cpu.sh: builds model and data once, then train.py --dry-run accepts its flags."""

import hashlib
import os
import subprocess

import pytest


def _venv_current(repo_root) -> bool:
    """True when .venv's install stamp matches setup.py (the script would otherwise pip install)."""
    stamp = repo_root / ".venv" / ".slime-installed"
    want = hashlib.sha256((repo_root / "setup.py").read_bytes()).hexdigest()
    return stamp.is_file() and stamp.read_text().strip() == want


def test_dry_run_builds_once_and_validates(repo_root, tmp_path):
    if not _venv_current(repo_root):
        pytest.skip(".venv is missing or older than setup.py; run scripts/test.sh to refresh it")
    env = {**os.environ, "SLIME_RUN_DIR": str(tmp_path / "run"), "DRY_RUN": "1"}

    def run():
        return subprocess.run(["bash", str(repo_root / "scripts/run-tiny-moe-cpu.sh")], env=env,
                              capture_output=True, text=True, timeout=300)

    first = run()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "dry run done" in first.stdout
    assert "global batch size" in first.stdout  # train.py printed its plan
    # megatron-core's configs built as the CPU run builds them (--distributed-backend gloo: no fusions)
    configs = first.stdout.split("== megatron-core configs")[1].split("\n\n")[0]
    assert "actor TransformerConfig" in configs and "torch.float32, fusions: none" in configs
    assert "actor OptimizerConfig" in configs and "actor DDP config" in configs
    built = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file()}
    names = {p.name for p in built}
    assert {"model.safetensors", "config.json", "train.jsonl", "eval.jsonl"} <= names
    second = run()
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in built} == built  # nothing rebuilt


def test_multi_token_task_dry_run_uses_its_own_data_and_reward(repo_root, tmp_path):
    if not _venv_current(repo_root):
        pytest.skip(".venv is missing or older than setup.py; run scripts/test.sh to refresh it")
    env = {**os.environ, "SLIME_RUN_DIR": str(tmp_path / "run"), "DRY_RUN": "1", "TASK": "parity_twice"}
    out = subprocess.run(["bash", str(repo_root / "scripts/run-tiny-moe-cpu.sh")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "task: parity_twice" in out.stdout and "dry run done" in out.stdout
    rows = (tmp_path / "run" / "data-parity_twice" / "train.jsonl").read_text().splitlines()
    assert rows and all('"label": "00"' in r or '"label": "11"' in r for r in rows)
    assert not (tmp_path / "run" / "data").exists()  # the parity data folder is not touched


def test_unknown_task_is_refused_before_any_work(repo_root, tmp_path):
    env = {**os.environ, "SLIME_RUN_DIR": str(tmp_path / "run"), "DRY_RUN": "1", "TASK": "nope",
           "PATH": os.environ["PATH"]}
    if not _venv_current(repo_root):
        pytest.skip(".venv is missing or older than setup.py; run scripts/test.sh to refresh it")
    out = subprocess.run(["bash", str(repo_root / "scripts/run-tiny-moe-cpu.sh")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "TASK=nope" in out.stderr
    assert not (tmp_path / "run" / "hf").exists()
