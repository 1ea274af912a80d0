"""examples/tool_use/run-tool-use-cpu.sh: the entry point and generate function TOOL / ASYNC pick,
validated by a dry run; a bad value is refused before anything is built."""

import os
import subprocess

import pytest

from tests.unit.tools.test_run_tiny_moe_cpu import _venv_current


def _run(repo_root, tmp_path, **env):
    env = {**os.environ, "SLIME_RUN_DIR": str(tmp_path / "run"), "DRY_RUN": "1", **env}
    return subprocess.run(["bash", str(repo_root / "examples/tool_use/run-tool-use-cpu.sh")], env=env,
                          capture_output=True, text=True, timeout=300)


def test_baseline_async_dry_run(repo_root, tmp_path):
    if not _venv_current(repo_root):
        pytest.skip(".venv is missing or older than setup.py; run scripts/test.sh to refresh it")
    out = _run(repo_root, tmp_path, TOOL="0", ASYNC="1")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "tool: 0 (generate_without_tool)  entry: train_async.py" in out.stdout
    assert "dry run done" in out.stdout and "global batch size" in out.stdout
    rows = (tmp_path / "run" / "data-mod3" / "train.jsonl").read_text().splitlines()
    assert len(rows) == 4096 and '"question": ' in rows[0]


@pytest.mark.parametrize("env, flag", [({"TOOL": "2"}, "TOOL=2"), ({"ASYNC": "yes"}, "ASYNC=yes")])
def test_bad_switch_is_refused(repo_root, tmp_path, env, flag):
    if not _venv_current(repo_root):
        pytest.skip(".venv is missing or older than setup.py; run scripts/test.sh to refresh it")
    out = _run(repo_root, tmp_path, **env)
    assert out.returncode == 2 and flag in out.stderr
    assert not (tmp_path / "run" / "hf").exists()
