"""Run folders: one job per folder (a lock naming its holder; a dead holder's lock is taken over),
and a launch that would destroy a run already there is refused unless it resumes it."""

import json
import os
import subprocess
import sys
from argparse import Namespace

import pytest

from slime.utils.run_folder import LOCK_NAME, RunFolderError, RunLock, rerun_refusal, claim_run_folder

HOLD = """
import sys
from pathlib import Path
from slime.utils.run_folder import RunLock
lock = RunLock([("--metrics-dir", Path(sys.argv[1]))], command=["train.py", "--holder"]).acquire()
print("locked", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/run until the test ends."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.stdout.readline().strip() == "locked"
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def test_second_lock_refused_naming_folder_and_holder(tmp_path, holder):
    folder = tmp_path / "run"
    with pytest.raises(RunFolderError) as err:
        RunLock([("--metrics-dir", folder)]).acquire()
    message = str(err.value)
    assert str(folder) in message and f"PID {holder.pid}" in message and "train.py --holder" in message


def test_lock_of_a_dead_holder_is_taken_over_with_a_warning(tmp_path, holder, caplog):
    holder.stdin.close()
    holder.wait(timeout=30)
    folder = tmp_path / "run"
    with RunLock([("--metrics-dir", folder)], command=["train.py", "again"]):
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert any("taking over the lock" in r.getMessage() and str(holder.pid) in r.getMessage() for r in caplog.records)


def test_failed_second_folder_releases_the_first(tmp_path, holder):
    free = tmp_path / "save"
    with pytest.raises(RunFolderError):
        RunLock([("--save", free), ("--metrics-dir", tmp_path / "run")]).acquire()
    with RunLock([("--save", free)]):  # not left locked by the refused launch
        pass


def _args(tmp_path, **kw):
    base = dict(metrics_dir=str(tmp_path / "run"), save=str(tmp_path / "ckpt"), load=None, overwrite_run=False)
    return Namespace(**{**base, **kw})


def test_rerun_refused_when_folder_holds_a_run(tmp_path):
    args = _args(tmp_path)
    assert rerun_refusal(args) is None  # empty folders: a first run
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"rollout_id": 0}\n')
    refusal = rerun_refusal(args)
    assert refusal.startswith("--metrics-dir") and "--overwrite-run" in refusal and "--load" in refusal
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("19")
    refusal = rerun_refusal(args)
    assert refusal.startswith(f"--save {tmp_path / 'ckpt'}") and f"--load {tmp_path / 'ckpt'}" in refusal
    assert rerun_refusal(_args(tmp_path, load=str(tmp_path / "ckpt"))) is None  # a resume
    assert rerun_refusal(_args(tmp_path, overwrite_run=True)) is None


def test_overwrite_keeps_the_old_metrics_beside(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"rollout_id": 0}\n')
    (tmp_path / "ckpt").mkdir()
    aside = claim_run_folder(_args(tmp_path, overwrite_run=True))
    assert aside.read_text() == '{"rollout_id": 0}\n' and not (tmp_path / "run" / "metrics.jsonl").exists()
    assert claim_run_folder(_args(tmp_path)) is None


def test_metrics_folder_of_another_run_is_refused(tmp_path):
    """Two recipes left on the default --metrics-dir: the second may not append to the first's rows."""
    (tmp_path / "run").mkdir()
    first = _args(tmp_path, save=str(tmp_path / "a"), load=str(tmp_path / "a"))
    claim_run_folder(first)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"rollout_id": 0}\n')
    assert rerun_refusal(first) is None  # its own resume
    refusal = rerun_refusal(_args(tmp_path, save=str(tmp_path / "b"), load=str(tmp_path / "b")))
    assert refusal.startswith("--metrics-dir") and f"saving to {tmp_path / 'a'}" in refusal and "--overwrite-run" in refusal
