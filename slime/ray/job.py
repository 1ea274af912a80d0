"""The pieces `train.py` and `train_async.py` are written in: Ray start-up, placement, the rollout
side, the actor side and the schedule. Each side owns its debug mode (`--debug-rollout-only`
leaves the trainer out, `--debug-train-only` the engines) and its perf timer, so the loops stay
free of branches.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager

import ray

from slime.ray.actor_group import RayTrainGroup
from slime.ray.placement import JobPlacement, PlacementPlan, create_placement

logger = logging.getLogger(__name__)


def _use_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def start_ray(args) -> None:
    """Join the cluster at `RAY_ADDRESS` (or `ray start --head` on this node); without one, start a
    local Ray with a logical CPU per bundle so CPU jobs get one bundle per rank."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        return
    plan = PlacementPlan.from_args(args)
    ray.init(num_cpus=max(plan.num_bundles + 2, os.cpu_count() or 1), include_dashboard=False)


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
        from slime.ray.rollout_manager import RolloutManager

        job_placement, plan = placement
        self.args = args
        self.manager = RolloutManager.options(num_cpus=0).remote(args, job_placement, plan.rollout_bundles)
        self.offloaded = False

    def load(self, start_rollout_id: int) -> None:
        if start_rollout_id > 0:
            ray.get(self.manager.load.remote(start_rollout_id - 1))

    def num_rollout(self) -> int:
        return ray.get(self.manager.num_rollout.remote())

    def generate(self, rollout_id: int) -> tuple[object, dict]:
        return self.collect(self.submit(rollout_id))

    def submit(self, rollout_id: int):
        """Start generating rollout `rollout_id`; returns a handle for `collect`."""
        if self.offloaded:
            ray.get(self.manager.onload.remote())
            self.offloaded = False
        return time.monotonic(), self.manager.generate.remote(rollout_id)

    def collect(self, handle) -> tuple[object, dict]:
        """(train data, metrics) of a submitted rollout; waits for it."""
        started, ref = handle
        data, metrics = ray.get(ref)
        return data, {**metrics, "perf/rollout_time": time.monotonic() - started}

    def evaluate(self, rollout_id: int) -> dict:
        metrics: dict = {}
        with _timed(metrics, "perf/eval_time"):
            metrics |= ray.get(self.manager.eval.remote(rollout_id))
        return metrics

    def offload(self) -> None:
        ray.get(self.manager.offload.remote())
        self.offloaded = True

    def engine_urls(self) -> list[str]:
        return ray.get(self.manager.engine_urls.remote())

    def save(self, rollout_id: int) -> dict:
        ray.get(self.manager.save.remote(rollout_id))
        return {}

    def shutdown(self) -> None:
        try:
            ray.get(self.manager.shutdown.remote(), timeout=60)
        finally:
            ray.kill(self.manager)


class ActorSide:
    """The trainer ranks (absent with `--debug-rollout-only`)."""

    def __init__(self, args, placement):
        job_placement, plan = placement
        self.args = args
        self.group = None if args.debug_rollout_only else RayTrainGroup(args, job_placement, plan.actor_bundles)

    def init(self) -> int:
        start = self.group.init() if self.group else 0
        return self.args.start_rollout_id if self.args.start_rollout_id is not None else start

    def train(self, rollout_id: int, data) -> dict:
        if self.group is None:
            return {}
        return self.group.train(rollout_id, data)

    def save(self, rollout_id: int) -> dict:
        metrics: dict = {}
        if self.group is not None:
            with _timed(metrics, "perf/save_time"):
                self.group.save(rollout_id)
        return metrics

    def sync_weights(self, rollout: RolloutSide, version: int) -> dict:
        metrics: dict = {}
        if self.group is None or self.args.debug_train_only:
            return metrics
        with _timed(metrics, "perf/update_weights_time"):
            self.group.run("update_weights", rollout.engine_urls(), str(version))
        return metrics

    def onload_if_colocated(self, rollout: RolloutSide) -> None:
        """Colocated: engines give their memory back while the trainer runs."""
        if self.args.colocate and self.args.offload_rollout and self.group is not None:
            rollout.offload()

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
        interval = self.args.save_interval
        return bool(self.args.save) and bool(interval) and ((rollout_id + 1) % interval == 0 or self._last(rollout_id))

    def eval_after(self, rollout_id: int) -> bool:
        interval = self.args.eval_interval
        return bool(self.args.eval_prompt_data) and bool(interval) and (
            (rollout_id + 1) % interval == 0 or self._last(rollout_id))

    def eval_before_training(self) -> bool:
        return bool(self.args.eval_prompt_data) and bool(self.args.eval_interval) \
            and not self.args.skip_eval_before_train and self.start_rollout_id == 0
