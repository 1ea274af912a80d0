"""slime.ray.job.RayStart: Ray starting in the background while train.py checks megatron-core's
configs. Handed over, the JobScope owns it; not handed over (a refusal), it is stopped with every
process of the job; a failed start raises in the caller; SIGTERM still unwinds the job."""

import signal
from types import SimpleNamespace

import pytest

from slime.ray import job


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(job, "start_ray", lambda args: calls.append("start") or "tok")
    monkeypatch.setattr(job.ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(job, "stop_job_processes", lambda token: calls.append(("stop", token)))
    previous = signal.getsignal(signal.SIGTERM)
    yield calls
    signal.signal(signal.SIGTERM, previous)


def test_not_handed_over_it_is_stopped(recorded):
    with job.RayStart(SimpleNamespace()):
        pass  # e.g. megatron-core refused the configs
    assert recorded == ["start", "shutdown", ("stop", "tok")]
    assert signal.getsignal(signal.SIGTERM) is job._exit_on_sigterm


def test_handed_over_the_job_scope_owns_it(recorded, monkeypatch):
    monkeypatch.setattr(job, "place", lambda args: ("placement", "plan"))
    with job.RayStart(SimpleNamespace()) as early:
        scope = job.JobScope(SimpleNamespace(), early)
    assert scope.token == "tok" and recorded == ["start"]


def test_a_failed_start_raises_in_the_caller(monkeypatch):
    def fail(args):
        raise RuntimeError("no ray today")

    monkeypatch.setattr(job, "start_ray", fail)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(RuntimeError, match="no ray today"):
            with job.RayStart(SimpleNamespace()) as early:
                early.token()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_handler_exits():
    with pytest.raises(SystemExit) as e:
        job._exit_on_sigterm(signal.SIGTERM, None)
    assert e.value.code == signal.SIGTERM
