"""Trainer -> engine weight transport primitives shared by the sender (trainer) and the local engine.

Owns the wire format of the local engine's distributed weight-update endpoints (the colocated
tensor payload is `slime.utils.tensor_payload`):

1. Distributed updates (`/init_weights_update_group`, `/update_weights_from_distributed`): a
   process group outside `torch.distributed`'s default world. Rendezvous: a `TCPStore` served by
   rank 0 (the trainer) at `master_address:master_port`; all keys live under the prefix
   `"{group_name}/{device}/"` (device "cpu" for gloo, "cuda" for nccl) - the same layout torch's
   `_new_process_group_helper` gives a group named `group_name`. The engine joins as rank
   `rank_offset`; tensors are broadcast from rank 0 one by one, in the order of the request's
   `names`.

Imports torch only (utils layer).
"""

from __future__ import annotations

import dataclasses
import datetime

import torch
import torch.distributed as dist

from slime.utils.fp8 import wire_view

_BACKENDS = {
    "gloo": ("cpu", lambda store, rank, size, timeout: dist.ProcessGroupGloo(store, rank, size, timeout)),
    "nccl": ("cuda", lambda store, rank, size, timeout: dist.ProcessGroupNCCL(store, rank, size)),
}


@dataclasses.dataclass
class WeightUpdateGroup:
    """A live weight-update group: broadcast tensors from rank 0 to every member."""

    name: str
    rank: int
    world_size: int
    device: str
    pg: object
    store: object

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Broadcast `tensor` in place from `src` (blocking); every member calls it in the same order."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([wire_view(tensor, self.device)], opts).wait()  # float8 as bytes on gloo


def init_weight_update_group(master_address: str, master_port: int, rank: int, world_size: int,
                             group_name: str, backend: str = "gloo", timeout_s: float = 300.0) -> WeightUpdateGroup:
    """Create (rank 0) or join (rank > 0) a weight-update group; blocks until all ranks joined.

    Every rank must call this concurrently (rank 0 serves the TCPStore at master_port).
    """
    if backend not in _BACKENDS:
        raise ValueError(f"weight update backend {backend!r} is not supported; use one of {sorted(_BACKENDS)}")
    device, make = _BACKENDS[backend]
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, int(master_port), world_size, rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore(f"{device}/", dist.PrefixStore(f"{group_name}/", store))
    pg = make(prefixed, rank, world_size, timeout)
    return WeightUpdateGroup(group_name, rank, world_size, device, pg, store)
