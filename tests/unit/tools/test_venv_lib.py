"""scripts/lib/venv.sh: SLIME_NO_VENV=1 uses the current Python as it is (a GPU image's torch, TE
and SGLang), creating and installing nothing, and refuses a Python that lacks slime's stack."""

import os
import stat
import subprocess


def _ensure(repo_root, tmp_path, python_body: str):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python"
    fake.write_text(f"#!/bin/sh\n{python_body}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    script = f'source "{repo_root}/scripts/lib/venv.sh"; ensure_venv; echo "rc=$? PYTHONPATH=$PYTHONPATH"'
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "SLIME_NO_VENV": "1", "PYTHONPATH": "/elsewhere"}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_no_venv_uses_the_current_python(repo_root, tmp_path):
    venv_before = (repo_root / ".venv" / "bin" / "activate").stat().st_mtime_ns if (repo_root / ".venv").exists() else None
    done = _ensure(repo_root, tmp_path, "exit 0")
    assert f"rc=0 PYTHONPATH={repo_root}:/elsewhere" in done.stdout, done.stdout + done.stderr
    after = (repo_root / ".venv" / "bin" / "activate").stat().st_mtime_ns if (repo_root / ".venv").exists() else None
    assert after == venv_before


def test_no_venv_refuses_a_python_without_the_stack(repo_root, tmp_path):
    done = _ensure(repo_root, tmp_path, "exit 1")
    assert "rc=1" in done.stdout
    assert "SLIME_NO_VENV=1" in done.stderr and "megatron.core" in done.stderr
