"""collectives.py: a host tensor in a collective on a device (NCCL on GPU) group fails on CPU too.

The spawned test runs megatron's groups on 2 gloo ranks (TP1, DP2) and injects a host tensor
into the trainer's own code paths by undoing their placement (`to_device` made the identity, as if
the call site had forgotten it): they must raise where NCCL would."""

import argparse
import types

import pytest
import torch

from slime.backends.megatron_utils import collectives
from tests.unit.backends.megatron_utils.spawn_util import spawn


def test_to_device_marks_an_alias_sharing_storage():
    host = torch.zeros(3)
    placed = collectives.to_device(host)
    placed += 1  # an in-place collective writes through, as on GPU for a tensor already there
    assert host.tolist() == [1.0, 1.0, 1.0]
    assert collectives.to_device(placed) is placed
    collectives.check_placed(placed, None, "all_reduce")
    with pytest.raises(collectives.HostTensorInCollective, match="all_reduce on the default group"):
        collectives.check_placed(host, None, "all_reduce")
    with pytest.raises(collectives.HostTensorInCollective):  # computed from a placed tensor: place again
        collectives.check_placed(placed * 2, None, "all_reduce")


def test_host_groups_are_told_by_their_description():
    def group(desc):
        return types.SimpleNamespace(group_desc=desc)

    assert collectives.is_host_group(group("DATA_PARALLEL_GROUP_GLOO"))
    assert collectives.is_host_group(group(collectives.HOST_GROUP_PREFIX + "x"))
    assert not collectives.is_host_group(group("DATA_PARALLEL_GROUP"))
    assert not collectives.is_host_group(None)  # the default group: NCCL on GPU
    collectives.check_placed(torch.zeros(1), group("EXPERT_DATA_PARALLEL_GROUP_GLOO"), "all_reduce")


def _raises(fn) -> bool:
    try:
        fn()
    except collectives.HostTensorInCollective:
        return True
    return False


def _worker(rank, world):
    from megatron.core import parallel_state as mpu

    from slime.backends.megatron_utils import advantage_data
    from slime.backends.megatron_utils.data_split import DataSplitMixin
    from slime.backends.megatron_utils.parallel import destroy_parallel, initialize_megatron

    initialize_megatron(argparse.Namespace(seed=1, distributed_backend="gloo"))
    dp = mpu.get_data_parallel_group()
    out = {
        "raw_host": _raises(lambda: collectives.all_reduce(torch.ones(1), group=dp)),
        "placed": collectives.all_reduce(collectives.device_tensor([1.0]), group=dp).tolist(),
        "megatron_gloo": collectives.all_reduce(torch.ones(1), group=mpu.get_data_parallel_group_gloo()).tolist(),
        "ours_host": collectives.all_reduce(torch.ones(1), group=collectives.new_host_group([0, 1], "t")).tolist(),
        "gathered": [t.tolist() for t in collectives.all_gather(collectives.device_tensor([rank]), group=dp)],
        "split": DataSplitMixin._agreed_microbatches([5, 3, 4][: 2 + rank], 6),
    }
    masks = [torch.ones(3)]
    out["whitened"] = advantage_data.whiten_over_group([torch.tensor([1.0, 2.0, 3.0 + rank])], masks, dp)[0].tolist()
    placement = collectives.to_device
    collectives.to_device = lambda t: t  # inject: every call site forgets the placement
    try:
        out["split_injected"] = _raises(lambda: DataSplitMixin._agreed_microbatches([5, 3], 6))
        out["whiten_injected"] = _raises(lambda: advantage_data.whiten_over_group([torch.ones(3)], masks, dp))
    finally:
        collectives.to_device = placement
    destroy_parallel()
    return out


def test_host_tensors_fail_on_megatron_groups_and_pass_on_host_groups(tmp_path):
    results = spawn(_worker, 2, tmp_path)
    for rank, got in enumerate(results):
        assert got["raw_host"] and got["split_injected"] and got["whiten_injected"], rank
        assert got["placed"] == got["megatron_gloo"] == got["ours_host"] == [2.0]
        assert got["gathered"] == [[0], [1]]
    assert len(results[0]["split"]) == len(results[1]["split"])  # agreed over data parallel
    assert results[0]["whitened"] != [1.0, 2.0, 3.0]  # whitened with both ranks' moments
