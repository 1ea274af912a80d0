"""Colocated weight sync with pipeline parallelism: every rank of a pipeline group gets every
stage's buckets, stage 0 first, whatever the number of buckets per stage (2 gloo ranks = 2 stages).
Before, `build_weight_sender` refused --colocate with --pipeline-model-parallel-size > 1, which
four GPU recipes use (found by their CPU twins)."""

import torch

from tests.unit.backends.megatron_utils.spawn_util import spawn


def _stage_buckets(stage: int):
    """Stage 0: two buckets (a float and a bf16 tensor, then one); stage 1: one bucket."""
    if stage == 0:
        return [[("layers.0.w", torch.arange(6.0).reshape(2, 3)), ("layers.0.b", torch.ones(2, dtype=torch.bfloat16))],
                [("embed", torch.full((4,), 3.0))]]
    return [[("layers.1.w", torch.arange(4.0).reshape(2, 2) * -1)]]


def _worker(rank, world_size):
    import torch.distributed as dist

    from slime.backends.megatron_utils.update_weight.pipeline import all_stage_buckets

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    group = dist.new_group([0, 1], backend="gloo")
    got = list(all_stage_buckets(lambda: iter(_stage_buckets(rank)), rank, [0, 1], group, torch.device("cpu")))
    dist.destroy_process_group()
    return got


def test_every_rank_gets_every_stage_in_order(tmp_path):
    expected = _stage_buckets(0) + _stage_buckets(1)
    for got in spawn(_worker, 2, tmp_path):
        assert [[n for n, _ in b] for b in got] == [[n for n, _ in b] for b in expected]
        for bucket, want in zip(got, expected):
            for (_, t), (_, w) in zip(bucket, want):
                assert t.dtype == w.dtype and torch.equal(t, w)
