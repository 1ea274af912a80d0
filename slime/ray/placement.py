"""One Ray placement group for the whole job, a bundle per device, sorted by (node, device).

Colocated (`--colocate`): trainer and engines share the first max(actor, rollout) bundles.
Disaggregated: actor bundles first, then the critic's (`--advantage-estimator ppo`), then rollout
bundles. On a machine without GPUs a bundle is one CPU "rank" (a logical CPU of Ray's), so the
same layout runs on a laptop.
Bundles are ordered by node IP, node id and device id (GPU bundles: as an actor inside each
reports them; CPU bundles: from Ray's placement-group and node tables), so rank r of the trainer
sits on a predictable device across nodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.utils.arguments.critic import critic_world_size

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlacementPlan:
    """How many bundles the job needs and which of them (in sorted order) each side uses."""

    num_bundles: int
    actor_bundles: tuple[int, ...]
    rollout_bundles: tuple[int, ...]
    critic_bundles: tuple[int, ...] = ()

    @classmethod
    def from_args(cls, args) -> "PlacementPlan":
        actor = args.actor_num_nodes * args.actor_num_gpus_per_node
        rollout = 0 if getattr(args, "debug_train_only", False) else (args.rollout_num_gpus or 0)
        if getattr(args, "debug_rollout_only", False):
            actor = 0
        if args.colocate:
            total = max(actor, rollout)
            return cls(total, tuple(range(actor)), tuple(range(rollout)))
        critic = critic_world_size(args)  # ppo (refused with --colocate)
        first_rollout = actor + critic
        return cls(first_rollout + rollout, tuple(range(actor)), tuple(range(first_rollout, first_rollout + rollout)),
                   tuple(range(actor, first_rollout)))


@ray.remote(num_cpus=0)
class _Probe:
    """Reports where its bundle landed."""

    def where(self):
        ctx = ray.get_runtime_context()
        gpu_ids = ray.get_gpu_ids()
        return ray.util.get_node_ip_address(), ctx.get_node_id(), int(gpu_ids[0]) if gpu_ids else -1


@dataclass
class JobPlacement:
    """The placement group plus its bundle indices in (node IP, node id, device id) order."""

    group: object
    sorted_bundles: list[int]
    locations: list[tuple[str, str, int]]
    use_gpu: bool

    def strategy(self, position: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy that pins an actor to the `position`-th bundle in sorted order."""
        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.sorted_bundles[position]
        )


def create_placement(num_bundles: int, use_gpu: bool, timeout: float = 300.0) -> JobPlacement:
    """Reserve `num_bundles` bundles (1 GPU + 1 CPU each, or 1 CPU each without GPUs), wait for
    them, and sort them by where they landed."""
    if num_bundles <= 0:
        raise ValueError("the job needs at least one device (check --actor-num-gpus-per-node / --rollout-num-gpus)")
    bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(num_bundles)], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    if not ready:
        raise RuntimeError(
            f"Ray could not reserve {num_bundles} bundles of {bundle} within {timeout:.0f}s; "
            f"the cluster has {ray.cluster_resources()}"
        )
    locations = _probed_locations(group, num_bundles) if use_gpu else _table_locations(group, num_bundles)
    order = sorted(range(num_bundles), key=lambda i: (locations[i], i))
    logger.info("placement: %s", [(i, locations[i]) for i in order])
    return JobPlacement(group, order, [locations[i] for i in order], use_gpu)


def _probed_locations(group, num_bundles: int) -> list[tuple[str, str, int]]:
    """(node IP, node id, GPU id) of each bundle, as a `_Probe` actor inside it reports them: the
    GPU Ray gives a bundle is known only inside it."""
    probes = [
        _Probe.options(
            num_gpus=0.01,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i),
        ).remote()
        for i in range(num_bundles)
    ]
    locations = ray.get([p.where.remote() for p in probes])
    for p in probes:
        ray.kill(p)
    return locations


def _table_locations(group, num_bundles: int) -> list[tuple[str, str, int]]:
    """(node IP, node id, -1) of each CPU bundle, from Ray's placement-group and node tables: no
    probe actor, whose worker process would be started and killed (on 2 cores, with Ray starting
    at most 2 workers at a time, that is most of a second of start-up, and the workers Ray starts
    ahead would go to the probes instead of the job's actors)."""
    node_of_bundle = placement_group_table(group)["bundles_to_node_id"]
    address = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    return [(address[node_of_bundle[i]], node_of_bundle[i], -1) for i in range(num_bundles)]
