"""Placement: bundle arithmetic for colocated/disaggregated jobs, and a real placement group that
spans two simulated Ray nodes on this machine, sorted by node."""

from types import SimpleNamespace

import pytest
import ray
from ray.cluster_utils import Cluster

from slime.ray.placement import PlacementPlan, _Probe, create_placement


def _args(**kw):
    base = dict(actor_num_nodes=1, actor_num_gpus_per_node=4, rollout_num_gpus=4, colocate=False)
    return SimpleNamespace(**{**base, **kw})


def test_colocated_shares_bundles():
    plan = PlacementPlan.from_args(_args(colocate=True, rollout_num_gpus=2))
    assert plan.num_bundles == 4
    assert plan.actor_bundles == (0, 1, 2, 3) and plan.rollout_bundles == (0, 1)


def test_disaggregated_actor_first_then_rollout():
    plan = PlacementPlan.from_args(_args(actor_num_gpus_per_node=2, rollout_num_gpus=3))
    assert plan.num_bundles == 5
    assert plan.actor_bundles == (0, 1) and plan.rollout_bundles == (2, 3, 4)


def test_debug_modes_drop_a_side():
    assert PlacementPlan.from_args(_args(debug_train_only=True)).rollout_bundles == ()
    assert PlacementPlan.from_args(_args(debug_rollout_only=True)).actor_bundles == ()


@pytest.fixture
def two_node_cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_placement_spans_two_nodes_sorted_by_node(two_node_cluster):
    placement = create_placement(4, use_gpu=False, timeout=120)
    node_ids = [loc[1] for loc in placement.locations]
    assert len(set(node_ids)) == 2, f"bundles did not span both nodes: {placement.locations}"
    # sorted: all bundles of one node come before those of the other
    assert node_ids == sorted(node_ids)
    assert sorted(placement.sorted_bundles) == [0, 1, 2, 3]
    # CPU bundles are located from Ray's tables: what an actor inside each bundle reports
    probes = [_Probe.options(scheduling_strategy=placement.strategy(position)).remote() for position in range(4)]
    assert ray.get([p.where.remote() for p in probes]) == placement.locations


def test_critic_bundles_sit_between_actor_and_rollout():
    args = _args(actor_num_gpus_per_node=2, rollout_num_gpus=1, advantage_estimator="ppo",
                 critic_num_nodes=1, critic_num_gpus_per_node=2)
    plan = PlacementPlan.from_args(args)
    assert (plan.num_bundles, plan.actor_bundles, plan.critic_bundles, plan.rollout_bundles) == (5, (0, 1), (2, 3), (4,))
    assert PlacementPlan.from_args(_args(actor_num_gpus_per_node=2, rollout_num_gpus=1)).critic_bundles == ()
