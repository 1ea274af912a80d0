"""slime.ray.job_ray.RayStart: Ray started before the job's scope while train.py checks megatron-core's
configs in a thread. Handed over, the JobScope owns it; not handed over (a refusal), it is stopped
with every process of the job."""

from types import SimpleNamespace

from slime.ray import job, job_ray


def _record(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(job_ray, "start_ray", lambda args: calls.append("start") or "tok")
    monkeypatch.setattr(job_ray.ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(job_ray, "stop_job_processes", lambda token: calls.append(("stop", token)))
    return calls


def test_not_handed_over_it_is_stopped(monkeypatch):
    calls = _record(monkeypatch)
    with job_ray.RayStart(SimpleNamespace()):
        pass  # e.g. megatron-core refused the configs
    assert calls == ["start", "shutdown", ("stop", "tok")]


def test_handed_over_the_job_scope_owns_it(monkeypatch):
    calls = _record(monkeypatch)
    monkeypatch.setattr(job, "place", lambda args: ("placement", "plan"))
    with job_ray.RayStart(SimpleNamespace()) as early:
        scope = job.JobScope(SimpleNamespace(), early)
    assert scope.token == "tok" and calls == ["start"]


def test_a_ray_this_job_did_not_start_is_left_alone(monkeypatch):
    calls = _record(monkeypatch)
    monkeypatch.setattr(job_ray, "start_ray", lambda args: calls.append("start") or None)  # already initialised
    with job_ray.RayStart(SimpleNamespace()):
        pass
    assert calls == ["start"]
