"""Every pipeline stage's weight buckets on every rank, for the colocated sender.

Owns `all_stage_buckets`. A colocated engine's TP rank i reads the payload serialized on device i
(`from_tensor`), and with pipeline parallelism the trainer ranks on an engine's devices hold
different stages: so, stage after stage, the ranks of that stage iterate their buckets (the TP / EP
gathers stay among them) and broadcast each bucket over their pipeline group (NCCL on GPU, gloo
on CPU), and every rank yields every stage's buckets, stage 0 first, on its own device.
"""

from __future__ import annotations

from typing import Callable, Iterator


def all_stage_buckets(stage_buckets: Callable[[], Iterator[list]], stage: int, group_ranks: list[int], group,
                      device) -> Iterator[list]:
    """Yield the buckets (lists of `(name, tensor)`) of every stage in `group_ranks` order.

    Collective over the pipeline group `group` (global ranks `group_ranks`, index = stage); this rank
    is stage `stage` and makes its own buckets with `stage_buckets()`. Received tensors are
    allocated on `device`; this stage's own tensors are yielded as they are.
    """
    import torch

    from slime.backends.megatron_utils import collectives

    for src_stage, src in enumerate(group_ranks):
        own = src_stage == stage
        mine = stage_buckets() if own else None
        while True:
            bucket = next(mine, None) if own else None
            meta = [None if bucket is None else [(n, tuple(t.shape), t.dtype) for n, t in bucket]] if own else [None]
            collectives.broadcast_object_list(meta, src=src, group=group)
            if meta[0] is None:
                break
            if own:
                tensors = [collectives.to_device(t.contiguous()) for _, t in bucket]
            else:
                tensors = [collectives.to_device(torch.empty(shape, dtype=dtype, device=device))
                           for _, shape, dtype in meta[0]]
            for tensor in tensors:
                collectives.broadcast(tensor, src=src, group=group)
            yield [(name, tensor) for (name, _, _), tensor in zip(meta[0], tensors)]
