"""The RolloutManager Ray actor: data source, engines, router, and rollout -> train data.

`RolloutManager.remote(args, placement)` owns everything on the rollout side of the loop:
- the data source (`--data-source-path`, saved / loaded with checkpoints),
- one `RolloutEngine` actor per engine on its rollout bundle (slime.ray.engines),
- the sglang-router (a `RouterProcess` it starts, or the one named by
  `--sglang-router-ip/--sglang-router-port`, where it only registers its engines),
- the rollout and eval calls (`--rollout-function-path`, `--eval-function-path`) and the turn of
  samples into the train-data dict the trainer consumes,
- with `--use-fault-tolerance`, a background thread that restarts a dead engine on its bundle and
  re-registers it with the router (the rollout's `generate` retries the requests that failed).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import ray
import torch

from slime.backends.sglang_utils.router import RouterProcess, add_worker, remove_worker, router_extra_args
from slime.ray.access import ROUTER_HOST
from slime.ray.engines import EngineStart, create_engine_actor, start_engines
from slime.utils.misc import free_port
from slime.rollout.generate_state import close_job_clients
from slime.rollout.train_data import logged_rollout_metrics, post_process_rewards, samples_to_train_data
from slime.utils.engine_client import SyncEngineClient
from slime.utils.misc import load_function
from slime.utils.startup_profile import mark
from slime.utils.plugins import (
    call_convert_samples_to_train_data,
    call_reward_post_process,
    call_log_function,
    call_rollout_fn,
    make_data_source,
)
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


def save_debug_samples(path_template: str, rollout_id: int, samples: list[Sample]) -> str:
    """`--save-debug-rollout-data`: torch.save {"rollout_id", "samples": [to_dict()]} to the
    template formatted with `rollout_id`; returns the path."""
    path = path_template.format(rollout_id=rollout_id)
    rows = [{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in s.to_dict().items()}
            for s in samples]  # numpy arrays as tensors, so the file loads with weights_only=True
    torch.save({"rollout_id": rollout_id, "samples": rows}, path)
    logger.info("rollout %d: %d samples saved to %s", rollout_id, len(samples), path)
    return path


def load_debug_samples(path_template: str, rollout_id: int) -> list[Sample]:
    """`--load-debug-rollout-data`: the samples `save_debug_samples` wrote for `rollout_id`.

    Loaded with `weights_only=True`: a file from elsewhere cannot run code when unpickled."""
    path = path_template.format(rollout_id=rollout_id)
    data = torch.load(path, weights_only=True)
    logger.info("rollout %d: replaying %d samples from %s", rollout_id, len(data["samples"]), path)
    return [Sample.from_dict(d) for d in data["samples"]]


def build_train_data(args, rollout_id: int, samples: list[Sample]) -> dict:
    """Samples -> train-data dict: `--custom-convert-samples-to-train-data-path`, or the default
    conversion with `--custom-reward-post-process-path`. (`--rollout-data-postprocess-path` runs
    on the trainer, after log-probs and advantages, as in slime.)"""
    if args.custom_convert_samples_to_train_data_path:
        fn = load_function(args.custom_convert_samples_to_train_data_path)
        data = call_convert_samples_to_train_data(fn, args, samples)
    else:
        data = samples_to_train_data(args, samples, rewards_fn=_rewards_fn(args))
    return data


def _rewards_fn(args):
    """Reward post-processing: `--custom-reward-post-process-path`, else group normalisation."""
    if not args.custom_reward_post_process_path:
        return post_process_rewards
    post = load_function(args.custom_reward_post_process_path)

    def custom(a, s):
        raw, rewards = call_reward_post_process(post, a, s)
        return [float(r) for r in raw], [float(r) for r in rewards]

    return custom


def eval_metrics(out) -> dict[str, float]:
    """`eval/<name>` (mean reward) and `eval/<name>/truncated_ratio` per dataset of a
    RolloutFnEvalOutput, plus the metrics it returned."""
    metrics = {}
    for name, data in out.data.items():
        metrics[f"eval/{name}"] = statistics.fmean(float(r) for r in data["rewards"])
        if data.get("truncated"):
            metrics[f"eval/{name}/truncated_ratio"] = statistics.fmean(float(t) for t in data["truncated"])
    metrics.update(out.metrics or {})
    return metrics


class _EngineMonitor:
    """Background thread calling `check()` every `interval` seconds until `stop()`."""

    def __init__(self, check, interval: float):
        self._check, self._interval = check, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._check()
            except Exception:  # fault tolerance: a failed round is logged, the next one retries
                logger.exception("engine health round failed; retrying in %.1fs", self._interval)

    def stop(self) -> None:
        """Ask the thread to end and wait for the round in progress."""
        self._stop.set()
        self._thread.join()


class _HealthGate:
    """Health rounds against memory release: one round at a time, no round while the engines are
    offloaded, and an offload waits for the round under way (a probe must not race SGLang's
    release, which it runs only when idle)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.offloaded = False

    @contextlib.contextmanager
    def round(self):
        """Hold the gate for one health round; yields whether engines may be probed now."""
        with self._lock:
            yield not self.offloaded

    def set_offloaded(self, value: bool) -> None:
        """Mark the engines (not) offloaded, once no round is under way."""
        with self._lock:
            self.offloaded = value


@ray.remote
class RolloutManager:
    """Rollout side of the loop as one Ray actor (see the module docstring)."""

    def __init__(self, args, placement, rollout_bundles=None, engines: EngineStart | None = None):
        """Start the engines (unless `engines`, started by the job's driver, are given: see
        `slime.ray.engines.start_engines`) and the router, create the data source, register every
        engine once up, and point `args.sglang_router_ip/port` at the router for the rollout
        function.

        `placement` is the job's `JobPlacement`; `rollout_bundles` the sorted bundle positions of
        the rollout (default: `PlacementPlan.from_args(args).rollout_bundles`).
        """
        mark("rollout manager: started")
        self.args = args
        self.placement = placement
        self.kind, self.engines, self.positions, self.urls, self.router = None, [], [], [], None
        if not args.debug_train_only:  # --debug-train-only replays recorded rollouts: no engines
            engines = engines or start_engines(args, placement, rollout_bundles)
            self.kind, self.engines, self.positions = engines.kind, engines.actors, engines.positions
            self.router = self._launch_router(args)  # while the engines start
        self.data_source = make_data_source(load_function(args.data_source_path), args)  # while both start
        # imported while they start (a path that does not import fails here, not at the first rollout)
        self.rollout_fn = load_function(args.rollout_function_path)
        self.eval_fn = load_function(args.eval_function_path or args.rollout_function_path)
        if self.router is not None:
            self.router.wait_ready()
            mark("router up")
        if self.engines:
            self.urls = ray.get(engines.urls)
            mark("engines up")
            for url in self.urls:
                add_worker(self.router_url, url)
        self._lock = threading.Lock()  # guards self.urls
        self._gate = _HealthGate()  # one health round at a time (monitor vs. generate), none offloaded
        self.monitor = None
        if args.use_fault_tolerance:
            interval = args.rollout_health_check_interval
            self.monitor = _EngineMonitor(self.check_engines, interval)

    def _launch_router(self, args) -> RouterProcess | None:
        """Our RouterProcess, launched (not yet answering: `wait_ready`), or None when
        --sglang-router-ip/--sglang-router-port name one."""
        if args.sglang_router_ip and args.sglang_router_port:
            self.router_url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
            logger.info("using the existing router at %s", self.router_url)
            return None
        host = ROUTER_HOST  # loopback on any cluster: its clients are all in this process
        port = free_port(host)
        log_dir = getattr(args, "rollout_log_dir", None)
        router = RouterProcess(host, port, policy=getattr(args, "router_policy", None) or "round_robin",
                               extra=router_extra_args(args),
                               log_path=Path(log_dir) / "router.log" if log_dir else None).launch()
        args.sglang_router_ip, args.sglang_router_port = host, port
        self.router_url = router.url
        return router

    def num_rollout(self) -> int:
        """`--num-rollout`, or `--num-epoch` epochs of the data source in `--rollout-batch-size` steps."""
        if self.args.num_rollout is not None:
            return int(self.args.num_rollout)
        return int(self.args.num_epoch) * len(self.data_source) // self.args.rollout_batch_size

    def router_address(self) -> tuple[str, int]:
        """(ip, port) of the router the rollout talks to."""
        return self.args.sglang_router_ip, self.args.sglang_router_port

    def engine_urls(self) -> list[str]:
        """Base URL of every engine, in engine-rank order."""
        with self._lock:
            return list(self.urls)

    def healthy_engine_urls(self) -> list[str]:
        """`engine_urls` for a weight update: with --use-fault-tolerance, every dead engine is
        restarted first (and a restart the health thread has under way is waited for), so the
        trainer never syncs to the URL of an engine that is gone."""
        if self.args.use_fault_tolerance:
            self.check_engines()
        return self.engine_urls()

    def engine_pids(self) -> list[int]:
        """Process id of every engine server (tests kill one to exercise fault tolerance)."""
        return ray.get([e.pid.remote() for e in self.engines])

    def health_check(self) -> list[bool]:
        """Whether each engine answers /health (a dead engine actor counts as unhealthy)."""
        out = []
        for engine in self.engines:
            try:
                out.append(ray.get(engine.is_healthy.remote()))
            except ray.exceptions.RayActorError:
                out.append(False)
        return out

    def check_engines(self) -> int:
        """Restart every unhealthy engine on its bundle and swap it in the router; returns how
        many were restarted. Skipped while the engines are offloaded."""
        with self._gate.round() as allowed:
            if not allowed:
                return 0
            dead = [rank for rank, healthy in enumerate(self.health_check()) if not healthy]
            for rank in dead:
                self._recover(rank)
            return len(dead)

    def _recover(self, rank: int) -> None:
        old = self.urls[rank]
        logger.warning("engine %d at %s is unhealthy: restarting it", rank, old)
        remove_worker(self.router_url, old)
        try:
            new = ray.get(self.engines[rank].restart.remote())
        except ray.exceptions.RayActorError:  # the actor itself died: a new one on the same bundle
            self.engines[rank] = create_engine_actor(self.args, self.placement, self.positions[rank], rank, self.kind)
            new = ray.get(self.engines[rank].start.remote(avoid_port=int(old.rsplit(":", 1)[1])))
        add_worker(self.router_url, new)
        with self._lock:
            self.urls[rank] = new
        logger.warning("engine %d back at %s", rank, new)

    def generate(self, rollout_id: int) -> tuple[dict, dict]:
        """One training rollout -> (train_data dict, metrics dict).

        Calls `--rollout-function-path` (or replays `--load-debug-rollout-data`), flattens the
        groups, converts them (`--custom-convert-samples-to-train-data-path` or the default with
        `--custom-reward-post-process-path`), and saves the samples to `--save-debug-rollout-data` when set.
        """
        args = self.args
        start = time.monotonic()
        if args.use_fault_tolerance:
            self.check_engines()
        extra_metrics = {}
        if args.load_debug_rollout_data:
            samples = load_debug_samples(args.load_debug_rollout_data, rollout_id)
        else:
            out = call_rollout_fn(self.rollout_fn, args, rollout_id, self.data_source, evaluation=False)
            samples = [s for group in out.samples for s in group]
            extra_metrics = dict(out.metrics or {})
        seconds = time.monotonic() - start
        if args.save_debug_rollout_data:
            save_debug_samples(args.save_debug_rollout_data, rollout_id, samples)
        train_data = build_train_data(args, rollout_id, samples)
        return train_data, logged_rollout_metrics(args, rollout_id, samples, extra_metrics, seconds)

    def eval(self, rollout_id: int) -> dict[str, float]:
        """Run `--eval-function-path` (default: the rollout function with evaluation=True);
        returns `eval/<name>` (mean reward) and `eval/<name>/truncated_ratio` per dataset."""
        args = self.args
        if args.use_fault_tolerance:
            self.check_engines()
        out = call_rollout_fn(self.eval_fn, args, rollout_id, self.data_source, evaluation=True)
        log_fn = args.custom_eval_rollout_log_function_path
        if log_fn and call_log_function(load_function(log_fn), rollout_id, args, out.data, dict(out.metrics or {})):
            return {}
        return eval_metrics(out)

    def offload(self, tags: list[str] | None = None) -> None:
        """Release the memory of SGLang's `tags` (None: all) on every engine (`--offload-rollout`,
        before training). Health checks pause until every tag is back; a health round under way
        finishes first (its probe must not race the release, which SGLang runs only when idle)."""
        self._gate.set_offloaded(True)
        ray.get([e.release_memory.remote(tags) for e in self.engines])

    def onload(self, tags: list[str] | None = None, all_back: bool = True) -> None:
        """Resume the memory of `tags` (None: all) on every engine: the weights before a weight
        update, the KV cache (and CUDA graphs) after it. `all_back`: nothing stays released."""
        ray.get([e.resume_memory.remote(tags) for e in self.engines])
        self._gate.set_offloaded(not all_back)

    def memory_occupation(self) -> dict[str, dict[str, int]]:
        """`{"held": {tag: bytes summed over engines}, "released": {tag: engines that released it}}`
        from the `memory_occupation` of /get_server_info (the local engine reports it; engines
        that do not are left out, so both are {} with SGLang engines)."""
        held: dict[str, int] = {}
        released: dict[str, int] = {}
        for url in self.engine_urls():
            occupation = SyncEngineClient(url).get_server_info().get("memory_occupation") or {}
            for key, value in occupation.items():
                if key.endswith("_bytes"):
                    held[key.removesuffix("_bytes")] = held.get(key.removesuffix("_bytes"), 0) + int(value)
            for tag in occupation.get("released_tags", []):
                released[tag] = released.get(tag, 0) + 1
        return {"held": held, "released": released}

    def save(self, rollout_id: int) -> None:
        """Save the data source's position after rollout `rollout_id` (under `--save`)."""
        self.data_source.save(rollout_id)

    def load(self, rollout_id: int | None = None) -> None:
        """Restore the data source's position (under `--load`; None: the latest saved)."""
        self.data_source.load(rollout_id)

    def shutdown(self) -> None:
        """Stop the health thread, the engines and the router this manager started (an existing
        router named by --sglang-router-ip/port keeps running, without our engines)."""
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        close_job_clients(self.args)  # the rollouts' HTTP clients, kept across rollouts
        if self.router is None and self.engines:
            for url in self.engine_urls():
                remove_worker(self.router_url, url)
        for engine in self.engines:
            try:
                ray.get(engine.stop.remote())
            except ray.exceptions.RayActorError:  # already gone: nothing left to stop
                logger.warning("an engine actor was already dead at shutdown")
            ray.kill(engine)
        self.engines, self.urls = [], []
        if self.router is not None:
            self.router.stop()
            self.router = None
