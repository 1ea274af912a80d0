"""slime.ray.job_ray.RayStart: Ray started before the job's scope while train.py checks megatron-core's
configs in a thread. Handed over, the JobScope owns it; not handed over (a refusal), it is stopped
with every process of the job."""

import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

from slime.ray import job, job_ray
from tests.e2e.runner import REPO_ROOT, subprocess_env


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


def test_a_ray_started_on_this_node_is_not_joined_without_ray_address():
    """`ray start` leaves its address in Ray's temp folder, where `ray.init()` without an address
    looks first: the job-local Ray must start anyway (it joined, and Ray refused its num_cpus:
    "When connecting to an existing cluster, num_cpus and num_gpus must not be provided")."""
    short = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    (Path(short) / "ray").mkdir()
    (Path(short) / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")  # a head that is gone
    code = textwrap.dedent("""
        from types import SimpleNamespace
        import ray
        from slime.ray import job_ray
        job_ray.PlacementPlan.from_args = staticmethod(lambda args: SimpleNamespace(num_bundles=1))
        token = job_ray.start_ray(SimpleNamespace())
        try:
            assert ray.is_initialized() and not ray.get_runtime_context().gcs_address.endswith(":9")
        finally:
            ray.shutdown()
            job_ray.stop_job_processes(token)
        print("ok")
    """)
    try:
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=120, env={**subprocess_env(), "RAY_TMPDIR": short})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
