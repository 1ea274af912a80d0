"""The job's Ray: started (`start_ray`, or early with `RayStart` while train.py checks its configs)
with the job token every process of the job inherits, and the job's processes still alive on this
node found and stopped by that token (`stop_job_processes`: engines and the router run in their
own sessions and would otherwise outlive Ray workers that were killed). `slime.ray.job.JobScope`
owns both for the job's lifetime.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from pathlib import Path

import ray

from slime.ray.access import prepare_local_ray, prepare_ray_join, private_ray_token
from slime.ray.placement import PlacementPlan
from slime.utils.security import API_KEY_ENV, ensure_job_api_key
from slime.utils.startup_profile import mark

logger = logging.getLogger(__name__)

JOB_TOKEN_ENV = "SLIME_JOB_TOKEN"
LEFTOVER_TERM_WAIT_S = 5.0


def start_ray(args) -> str | None:
    """Join the cluster at `RAY_ADDRESS` (e.g. a `ray start --head` on this node); without it, start a
    job-local Ray with a logical CPU per bundle so CPU jobs get one bundle per rank, also when
    another Ray runs on this node.

    Returns the job token (`$SLIME_JOB_TOKEN`, inherited by every worker of the job and the
    processes they start), or None when Ray was already initialised in this process. The job's
    API key (`$SLIME_API_KEY`, see `slime.utils.security.ensure_job_api_key`) travels the same
    way: a local Ray's workers inherit this process's environment; on a cluster both go in the
    job's runtime env (which Ray records: see docs/security.md). Ray's token file is made
    readable by its owner only, and a local Ray runs on loopback, without dashboard and metrics
    exporter (`slime.ray.access.prepare_local_ray`)."""
    if ray.is_initialized():
        return None
    token = os.environ[JOB_TOKEN_ENV] = uuid.uuid4().hex
    key = ensure_job_api_key(getattr(args, "sglang_api_key", None))
    private_ray_token(create=not os.environ.get("RAY_ADDRESS"))
    if os.environ.get("RAY_ADDRESS"):
        prepare_ray_join(os.environ["RAY_ADDRESS"])
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True,
                 runtime_env={"env_vars": {JOB_TOKEN_ENV: token, API_KEY_ENV: key}})
        mark("ray started")
        return token
    plan = PlacementPlan.from_args(args)
    prepare_local_ray()
    # address "local": a new Ray even when `ray start` left its address in Ray's temp folder (a head
    # on this node, another job's): ray.init without one would join it and refuse num_cpus
    ray.init(address="local", num_cpus=max(plan.num_bundles + 2, os.cpu_count() or 1), include_dashboard=False)
    mark("ray started")
    return token


def job_processes(token: str) -> list[int]:
    """Pids on this node (other than this one) whose environment carries `token` (Linux /proc;
    empty elsewhere)."""
    needle = f"{JOB_TOKEN_ENV}={token}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if int(entry.name) != os.getpid() and needle in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def stop_job_processes(token: str) -> list[int]:
    """SIGTERM every process of the job still alive on this node, SIGKILL those left after
    LEFTOVER_TERM_WAIT_S; returns the pids found."""
    pids = job_processes(token)
    if not pids:
        return []
    logger.warning("stopping %d leftover process(es) of this job: %s", len(pids), pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # ended on its own
                pass
        deadline = time.monotonic() + LEFTOVER_TERM_WAIT_S
        while time.monotonic() < deadline and set(pids) & set(job_processes(token)):
            time.sleep(0.2)
    return pids


class RayStart:
    """Ray started before the job's scope, so that it overlaps the driver's own work before the job
    (train.py runs megatron-core's config check, which imports megatron, in a thread meanwhile).

    `with RayStart(args) as early:` ... `JobScope(args, early)` takes the started Ray over (and
    stops it when the job ends); leaving the block without handing it over (a refusal, an error)
    stops Ray and the processes it started. Ray starts in the calling thread, never in a helper
    thread: Ray's processes die with the thread that started them (PR_SET_PDEATHSIG), and ray.init
    sets its SIGTERM handler from the main thread only."""

    def __init__(self, args):
        self._token = start_ray(args)
        self._handed_over = False

    def token(self) -> str | None:
        """The job token (as `start_ray` returns it); the JobScope owns Ray from now on."""
        self._handed_over = True
        return self._token

    def __enter__(self) -> "RayStart":
        return self

    def __exit__(self, *exc) -> None:
        if not self._handed_over and self._token is not None:
            ray.shutdown()
            stop_job_processes(self._token)
