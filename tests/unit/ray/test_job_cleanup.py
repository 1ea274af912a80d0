"""The job's last-resort cleanup: processes carrying the job token in their environment (and only
those) are found and stopped, SIGKILL following a SIGTERM that is ignored."""

import os
import subprocess
import sys

import pytest

from slime.ray import job_ray
from slime.ray.job_ray import JOB_TOKEN_ENV, job_processes, stop_job_processes

IGNORE_TERM = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"


def _spawn(token: str, code: str = "import time; time.sleep(120)") -> subprocess.Popen:
    env = {**os.environ, JOB_TOKEN_ENV: token}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # like an engine: its own session
    return proc


@pytest.fixture
def procs():
    started = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_only_processes_of_the_job_are_stopped(procs, monkeypatch):
    monkeypatch.setattr(job_ray, "LEFTOVER_TERM_WAIT_S", 10.0)
    mine, other = _spawn("job-a"), _spawn("job-b")
    procs += [mine, other]
    assert mine.pid in job_processes("job-a") and other.pid not in job_processes("job-a")
    assert stop_job_processes("job-a") == [mine.pid]
    assert mine.wait(timeout=10) is not None
    assert other.poll() is None
    assert stop_job_processes("job-a") == []


def test_sigterm_ignored_escalates_to_sigkill(procs, monkeypatch):
    monkeypatch.setattr(job_ray, "LEFTOVER_TERM_WAIT_S", 1.0)
    stubborn = _spawn("job-c", IGNORE_TERM)
    procs.append(stubborn)
    assert stubborn.stdout.readline().strip() == "ready"
    assert stop_job_processes("job-c") == [stubborn.pid]
    assert stubborn.wait(timeout=10) == -9
