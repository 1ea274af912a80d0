"""The pieces `train.py` and `train_async.py` are written in: Ray start-up, placement, the rollout
side, the actor side and the schedule. Each side owns its debug mode (`--debug-rollout-only`
leaves the trainer out, `--debug-train-only` the engines) and its perf timer, so the loops stay
free of branches.

`JobScope` is the job's lifetime: it starts Ray and the placement, tracks every side and sink it
starts, and on leaving (done, an error, Ctrl-C) stops them all, shuts a job-local Ray down and
ends any process of the job still alive on this node (found by the job token every process of
the job inherits in its environment: engines and the router run in their own sessions and would
otherwise outlive Ray workers that were killed).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

import ray

from slime.ray import job_ray
from slime.ray.actor_group import RayTrainGroup
from slime.ray.placement import JobPlacement, PlacementPlan, create_placement
from slime.utils.arguments.eval import evaluates
from slime.utils.failure import root_cause
from slime.utils.startup_profile import mark

logger = logging.getLogger(__name__)

ENGINE_TAGS = ("weights", "kv_cache", "cuda_graph")  # sglang.srt.constants.GPU_MEMORY_ALL_TYPES
TRAIN_TAGS = ("weights", "optimizer", "grads")  # slime.backends.megatron_utils.offload.TAGS



def _use_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


class JobScope:
    """`with JobScope(args) as job:` -- Ray, placement, and everything the job starts.

    `job.start(RolloutSide)` / `job.start(ActorSide)` build a side on the placement and
    `job.metrics_logger(total)` the sinks; all are stopped on exit, each even when another
    fails to stop, in reverse order of start. `early`: a `RayStart` already under way (else Ray
    starts here)."""

    def __init__(self, args, early: job_ray.RayStart | None = None):
        self.args = args
        self._stoppers: list = []
        self.token = early.token() if early is not None else job_ray.start_ray(args)
        self.placement = place(args)
        mark("placement ready")

    def start(self, side_cls):
        """`side_cls(args, placement)` (RolloutSide or ActorSide), shut down when the job ends."""
        side = side_cls(self.args, self.placement)
        self._stoppers.append(side.shutdown)
        return side

    def metrics_logger(self, total: int, start: int = 0):
        """The job's MetricsLogger (rollouts `start`..`total`), closed when the job ends."""
        from slime.utils.logging_sinks import MetricsLogger, SinkConfig

        log = MetricsLogger(SinkConfig.from_args(self.args), total=total, start=start)
        self._stoppers.append(log.close)
        return log

    def __enter__(self) -> "JobScope":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:  # the cause itself is reported once, by the entry point (one line, root cause)
            logger.error("job stopping after %s", type(root_cause(exc)).__name__ if exc is not None else exc_type.__name__)
        try:
            for stop in reversed(self._stoppers):
                try:
                    stop()
                except Exception:  # fault tolerance: one part failing to stop must not keep the rest up
                    logger.exception("while stopping the job: %s failed", getattr(stop, "__qualname__", stop))
        finally:  # also after a second Ctrl-C cut the orderly stop short
            if self.token is not None:
                ray.shutdown()
                job_ray.stop_job_processes(self.token)


def place(args) -> tuple[JobPlacement, PlacementPlan]:
    plan = PlacementPlan.from_args(args)
    return create_placement(plan.num_bundles, use_gpu=_use_gpu()), plan


@contextmanager
def _timed(metrics: dict, key: str):
    start = time.monotonic()
    yield
    metrics[key] = time.monotonic() - start


class RolloutSide:
    """The RolloutManager actor: engines, router, data source, rollout and eval functions."""

    def __init__(self, args, placement):
        from slime.ray.engines import start_engines
        from slime.ray.rollout_manager import RolloutManager

        job_placement, plan = placement
        self.args = args
        # the engines start here, so that their start overlaps the manager process's own
        engines = None if args.debug_train_only else start_engines(args, job_placement, plan.rollout_bundles)
        self.manager = RolloutManager.options(num_cpus=0).remote(args, job_placement, plan.rollout_bundles, engines)
        self.released: set[str] = set()  # SGLang memory tags the engines have released
        self.weights_from: ActorSide | None = None

    def keep_weights_from(self, actor: "ActorSide") -> None:
        """With --use-fault-tolerance, before each generation, engines restarted since the last
        weight sync get `actor`'s current weights (a restarted engine loads the checkpoint)."""
        self.weights_from = actor if self.args.use_fault_tolerance else None

    def load(self, start_rollout_id: int) -> None:
        if start_rollout_id > 0:
            ray.get(self.manager.load.remote(start_rollout_id - 1))

    def num_rollout(self) -> int:
        return ray.get(self.manager.num_rollout.remote())

    def generate(self, rollout_id: int) -> tuple[object, dict]:
        return self.collect(self.submit(rollout_id))

    def submit(self, rollout_id: int):
        """Start generating rollout `rollout_id`; returns a handle for `collect`."""
        self.onload()
        if self.weights_from is not None:
            self.weights_from.resync_restarted_engines(self)
        return self.manager.generate.remote(rollout_id)

    def collect(self, handle) -> tuple[object, dict]:
        """(train data, metrics) of a submitted rollout; waits for it. `perf/rollout_time` is the
        manager's own generation time (with train_async the wait here overlaps training)."""
        return ray.get(handle)

    def evaluate(self, rollout_id: int) -> dict:
        metrics: dict = {}
        with _timed(metrics, "perf/eval_time"):
            metrics |= ray.get(self.manager.eval.remote(rollout_id))
        return metrics

    @property
    def offloaded(self) -> bool:
        return bool(self.released)

    def offload(self, tags=ENGINE_TAGS) -> None:
        """Engines release the memory of SGLang's `tags` (default: all of it)."""
        tags = [t for t in tags if t not in self.released]
        if tags:
            ray.get(self.manager.offload.remote(tags))
            self.released |= set(tags)

    def onload(self, tags=ENGINE_TAGS) -> None:
        """Give the engines back the memory of `tags` that `offload` released (generation needs
        weights and KV cache, a weight update the weights)."""
        tags = [t for t in tags if t in self.released]
        if tags:
            left = self.released - set(tags)
            ray.get(self.manager.onload.remote(tags, all_back=not left))
            self.released = left

    def memory_metrics(self, phase: str) -> dict:
        """What the engines hold now, from the local engine's `memory_occupation` (engines that
        do not report it are left out): `perf/engines_<tag>_gib_<phase>` summed over engines and
        `perf/engines_<tag>_released_<phase>` (how many engines released the tag)."""
        occupation = ray.get(self.manager.memory_occupation.remote())
        metrics = {f"perf/engines_{tag}_gib_{phase}": n / 2**30 for tag, n in occupation["held"].items()}
        metrics |= {f"perf/engines_{tag}_released_{phase}": float(occupation["released"].get(tag, 0))
                    for tag in occupation["held"]}
        return metrics

    def engine_urls(self) -> list[str]:
        """URLs to sync weights to (dead engines restarted first under --use-fault-tolerance)."""
        return ray.get(self.manager.healthy_engine_urls.remote())

    def save(self, rollout_id: int) -> dict:
        ray.get(self.manager.save.remote(rollout_id))
        return {}

    def shutdown(self) -> None:
        try:
            ray.get(self.manager.shutdown.remote(), timeout=60)
        finally:
            ray.kill(self.manager)


def _merge(metrics: dict, new: dict) -> dict:
    """`metrics | new`, adding up the hand-over times (a sync offloads twice)."""
    for key, value in new.items():
        timed = key in ("perf/offload_train_time", "perf/onload_train_time")
        metrics[key] = metrics.get(key, 0.0) + value if timed else value
    return metrics


class ActorSide:
    """The trainer ranks (absent with `--debug-rollout-only`).

    Colocated, the trainer and the engines take turns on the GPUs (`docs/architecture.md`,
    "Colocated memory hand-over"): engines release all their memory before the trainer builds
    its model and before each train step; a weight sync takes the trainer's optimizer and grads
    off the GPU, gives the engines their weights back, syncs, takes the trainer's weights off and
    gives the engines their KV cache (and CUDA graphs) back. `--offload-train` alone moves the
    trainer's memory; `--offload-rollout` with `--colocate` the engines'."""

    def __init__(self, args, placement):
        job_placement, plan = placement
        self.args = args
        self.group = None if args.debug_rollout_only else RayTrainGroup(args, job_placement, plan.actor_bundles)
        self.synced: tuple[list[str], int] | None = None  # (engine URLs, version) of the last sync
        self.train_offloaded: set[str] = set()  # trainer memory tags given back now

    def _engines_hand_over(self) -> bool:
        return bool(self.args.colocate and self.args.offload_rollout and self.group is not None)

    def init(self, rollout: RolloutSide | None = None) -> int:
        """Build every rank's trainer (colocated: after `rollout`'s engines released their memory)."""
        if rollout is not None and self._engines_hand_over():
            rollout.offload()
        start = self.group.init() if self.group else 0
        return self.args.start_rollout_id if self.args.start_rollout_id is not None else start

    def offload(self, tags) -> dict:
        """`--offload-train`: the ranks give back the device memory of trainer tags `tags`."""
        tags = [t for t in tags if t not in self.train_offloaded]
        if not (self.args.offload_train and self.group is not None and tags):
            return {}
        metrics = self.group.run("offload", tags)
        self.train_offloaded |= set(tags)
        return metrics

    def onload(self, tags=TRAIN_TAGS) -> dict:
        """Take back the memory of `tags` given back by `offload`."""
        tags = [t for t in tags if t in self.train_offloaded]
        if not tags:
            return {}
        metrics = self.group.run("onload", tags)
        self.train_offloaded -= set(tags)
        return metrics

    def train(self, rollout_id: int, data) -> dict:
        if self.group is None:
            return {}
        metrics = self.onload()
        return metrics | self.group.train(rollout_id, data)

    def save(self, rollout_id: int) -> dict:
        metrics: dict = {}
        if self.group is not None:
            _merge(metrics, self.onload())
            with _timed(metrics, "perf/save_time"):
                self.group.save(rollout_id)
        return metrics

    def sync_weights(self, rollout: RolloutSide, version: int) -> dict:
        """Push the weights as `version`, handing the GPUs over around it when colocated."""
        metrics: dict = {}
        if self.group is None or self.args.debug_train_only:
            return metrics
        _merge(metrics, self.onload(["weights"]))  # the sender reads the trainer's weights
        _merge(metrics, self.offload(["optimizer", "grads"]))  # room for the engines' weights
        rollout.onload(["weights"])
        urls = rollout.engine_urls()
        with _timed(metrics, "perf/update_weights_time"):
            self.group.run("update_weights", urls, str(version))
        self.synced = (urls, version)
        _merge(metrics, self.offload(["weights"]))  # and the sender's buffers
        if self.train_offloaded:
            _merge(metrics, self.group.run("memory_held", "after_offload"))
        rollout.onload()  # KV cache and CUDA graphs: ready to generate
        return metrics

    def resync_restarted_engines(self, rollout: RolloutSide) -> None:
        """Push the last synced version again when the engines' URLs changed since (an engine
        was restarted by fault tolerance and serves the checkpoint's weights)."""
        if self.synced is None or rollout.engine_urls() == self.synced[0]:
            return
        logger.warning("engines changed since weight version %d was synced: syncing it again", self.synced[1])
        self.sync_weights(rollout, self.synced[1])

    def onload_if_colocated(self, rollout: RolloutSide) -> dict:
        """Colocated: the engines release all their memory and the trainer takes its memory back
        (metrics: the hand-over times and what the engines still hold while training)."""
        if not self._engines_hand_over():
            return self.onload()
        rollout.offload()
        return rollout.memory_metrics("in_train") | self.onload()

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.shutdown()


class Schedule:
    """Which rollouts run, and after which ones to save and evaluate."""

    def __init__(self, args, start_rollout_id: int, num_rollout: int | None = None):
        self.args = args
        self.start_rollout_id = start_rollout_id
        self.num_rollout = num_rollout if num_rollout is not None else args.num_rollout

    def rollouts(self) -> range:
        return range(self.start_rollout_id, self.num_rollout)

    def _last(self, rollout_id: int) -> bool:
        return rollout_id + 1 == self.num_rollout

    def save_after(self, rollout_id: int) -> bool:
        """Every `--save-interval` rollouts and after the last one (only the last without an interval)."""
        interval = self.args.save_interval
        periodic = bool(interval) and (rollout_id + 1) % interval == 0
        return bool(self.args.save) and (periodic or self._last(rollout_id))

    def sync_after(self, rollout_id: int) -> bool:
        """train.py: push weights every `--update-weights-interval` rollouts and after the last one
        (the final eval then sees the trained weights)."""
        return (rollout_id + 1) % self.args.update_weights_interval == 0 or self._last(rollout_id)

    def eval_after(self, rollout_id: int) -> bool:
        return evaluates(self.args) and (
            (rollout_id + 1) % self.args.eval_interval == 0 or self._last(rollout_id))

    def eval_before_training(self) -> bool:
        return evaluates(self.args) and not self.args.skip_eval_before_train and self.start_rollout_id == 0
