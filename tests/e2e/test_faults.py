"""Failure behaviour of the whole job (train.py as a subprocess on the tiny MoE, CPU):

- a trainer rank that dies (`os._exit`) or raises ends the job non-zero with a message naming
  the rank and the cause, and leaves no process of the job behind;
- SIGINT (Ctrl-C) or SIGTERM stops every process of the job (train.py, train_async.py);
- with --use-fault-tolerance, an engine killed mid-rollout is restarted and the run finishes
  (the trainer syncs its weights to the restarted engine), with wandb (offline) and tensorboard
  sinks on, perf timers in the metrics and the wandb key nowhere in the output.

Processes of a job are found by a marker variable the test puts in train.py's environment: Ray
workers, engines and the router all inherit it (independent of the job's own token).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.runner import REPO_ROOT, grpo_argv, read_metrics, rollout_rows, subprocess_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

MARK_ENV = "SLIME_FAULTS_TEST_MARK"
HOOKS = "tests.e2e.test_faults"
SECRET = "wandb-SECRET-not-for-logs-42"


# ----- hooks the trainer loads through --custom-megatron-before-train-step-hook-path ----------
def exit_rank1_at_rollout1(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """Rank 1's process dies (no cleanup, like a segfault or an OOM kill) before rollout 1's first
    step (slime's step_id counts steps within a rollout)."""
    import torch.distributed as dist

    if dist.get_rank() == 1 and rollout_id >= 1:
        os._exit(1)


def raise_on_rank1_at_step0(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """Rank 1 raises before its first step; rank 0 is left waiting in a collective."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("injected failure on purpose")


# ----- hook the RolloutManager loads through --rollout-sample-hook-path ------------------------
def kill_engine_in_rollout1(args, sample, *, rollout_id=None, evaluation=False):
    """SIGKILL the engine once, after the first finished sample of rollout 1 (mid-rollout)."""
    done = Path(args.save).parent / "engine_killed"
    if rollout_id == 1 and not evaluation and not done.exists():
        (pid,) = engine_pids(Path(args.hf_checkpoint))
        done.write_text(str(pid))
        os.kill(pid, signal.SIGKILL)
    return None


# ----- helpers ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tiny_moe_hf, tiny_moe_torch_dist, toy_data):
    """(hf_dir, ref_dir, data_dir) of the tiny MoE: the session's (no run of this module needs
    more than the 256 toy prompts: 3 rollouts x 16, or stopped during rollout 0)."""
    return tiny_moe_hf, tiny_moe_torch_dist, toy_data


def marked_pids(mark: str) -> list[int]:
    """Pids whose environment carries `MARK_ENV=mark`."""
    needle = f"{MARK_ENV}={mark}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def engine_pids(model_dir: Path) -> list[int]:
    """Pids of local engine servers serving `model_dir`."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"slime.backends.local_engine" in cmd and str(model_dir).encode() in cmd:
            out.append(int(entry.name))
    return out


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:150]
            out.append(f"{pid}: {cmd!r}")
        except OSError:
            pass
    return out


def assert_nothing_left(mark: str, grace: float = 15.0) -> None:
    """No process of the job remains (a few seconds for exits already under way)."""
    deadline = time.monotonic() + grace
    while marked_pids(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = marked_pids(mark)
    for pid in left:  # do not leak into the next test, whatever the verdict
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the job still alive after it exited: {describe(left)}"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_job(argv: list[str], log_path: Path, entry: str = "train.py") -> tuple[subprocess.Popen, str]:
    mark = uuid.uuid4().hex
    log = open(log_path, "w")  # noqa: SIM115 - the child writes it for its whole life
    env = {**subprocess_env(), MARK_ENV: mark, "RAY_DEDUP_LOGS": "0"}
    # as a terminal would start it: a shell without job control starts background commands with
    # SIGINT ignored, which the child (and Python's KeyboardInterrupt) would inherit
    proc = subprocess.Popen([sys.executable, entry, *argv], cwd=REPO_ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=_default_sigint)
    log.close()
    return proc, mark


def wait_exit(proc: subprocess.Popen, mark: str, timeout: float, log_path: Path) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        for pid in marked_pids(mark):
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"train.py still running after {timeout:.0f}s; log tail:\n{log_path.read_text()[-4000:]}")


def wait_for_line(proc: subprocess.Popen, log_path: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in log_path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            pytest.fail(f"train.py exited ({proc.returncode}) before {needle!r}:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"no {needle!r} within {timeout:.0f}s:\n{log_path.read_text()[-4000:]}")


# ----- tests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("hook, cause", [
    ("exit_rank1_at_rollout1", "rank 1 died"),
    ("raise_on_rank1_at_step0", "rank 1 raised: ValueError: injected failure on purpose"),
])
def test_trainer_rank_failure_ends_job(tiny, tmp_path, hook, cause):
    hf, ref, data = tiny
    argv = grpo_argv(hf, ref, data, tmp_path, num_rollout=3,
                     extra=["--custom-megatron-before-train-step-hook-path", f"{HOOKS}.{hook}"])
    log_path = tmp_path / "train.log"
    proc, mark = start_job(argv, log_path)
    code = wait_exit(proc, mark, timeout=300, log_path=log_path)
    text = log_path.read_text(errors="replace")
    assert code == 1, text[-4000:]
    assert "job failed: trainer train failed on " in text and cause in text, text[-4000:]
    assert_nothing_left(mark)
    assert not engine_pids(hf)


@pytest.mark.parametrize("entry, sig", [("train.py", signal.SIGINT), ("train_async.py", signal.SIGTERM)])
def test_interrupt_stops_every_process(tiny, tmp_path, entry, sig):
    hf, ref, data = tiny
    log_path = tmp_path / "train.log"
    proc, mark = start_job(grpo_argv(hf, ref, data, tmp_path, num_rollout=50), log_path, entry=entry)
    wait_for_line(proc, log_path, "rollout 0/50", timeout=300)
    assert engine_pids(hf), "no engine running during the run"
    proc.send_signal(sig)
    code = wait_exit(proc, mark, timeout=60, log_path=log_path)
    text = log_path.read_text(errors="replace")
    if sig == signal.SIGINT:
        assert code == 130 and "job interrupted" in text, text[-4000:]
    else:  # ray.init's SIGTERM handler exits (SystemExit), which unwinds the JobScope too
        assert code != 0 and "job stopping after SystemExit" in text, text[-4000:]
    assert_nothing_left(mark)
    assert not engine_pids(hf)


def test_engine_killed_with_fault_tolerance_run_finishes(tiny, tmp_path):
    hf, ref, data = tiny
    extra = ["--use-fault-tolerance", "--rollout-health-check-interval", "1",
             "--rollout-sample-hook-path", f"{HOOKS}.kill_engine_in_rollout1",
             "--rollout-log-dir", str(tmp_path / "engine_logs"),
             "--use-wandb", "--wandb-mode", "offline", "--wandb-key", SECRET, "--wandb-dir", str(tmp_path),
             "--wandb-project", "faults", "--use-tensorboard", "--tb-project-name", "faults",
             "--save-interval", "3"]
    log_path = tmp_path / "train.log"
    proc, mark = start_job(grpo_argv(hf, ref, data, tmp_path, num_rollout=3, extra=extra), log_path)
    code = wait_exit(proc, mark, timeout=300, log_path=log_path)
    text = log_path.read_text(errors="replace")
    assert code == 0, text[-4000:]
    assert (tmp_path / "engine_killed").is_file(), "the hook never killed the engine"
    assert "engine 0 back at" in text, text[-4000:]
    # The sync after rollout 1 went to the restarted engine: the sender built its group once at
    # start and again for the new engine URL.
    assert text.count("weight update group slime-weights") >= 2, text[-4000:]
    rows = read_metrics(tmp_path / "metrics" / "metrics.jsonl")
    assert sorted(rollout_rows(rows)) == [0, 1, 2]
    assert all(row["rollout/num_samples"] == 128 for row in rollout_rows(rows).values())  # none lost
    for key in ("perf/rollout_time", "perf/log_probs_time", "perf/train_time", "perf/update_weights_time",
                "perf/save_time"):
        assert key in rollout_rows(rows)[2], key
    assert list((tmp_path / "wandb").glob("offline-run-*")), "no offline wandb run written"
    assert list(tmp_path.glob("metrics/tensorboard/faults/run/events.out.tfevents.*"))
    for path in [log_path, tmp_path / "metrics" / "metrics.jsonl", *tmp_path.glob("engine_logs/*")]:
        assert SECRET not in path.read_text(errors="replace"), path
    assert_nothing_left(mark)
