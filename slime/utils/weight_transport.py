"""Trainer -> engine weight transport primitives shared by the sender (trainer) and the local engine.

Owns the wire format of the local engine's distributed weight-update endpoints (the colocated
tensor payload is `slime.utils.tensor_payload`):

1. Distributed updates (`/init_weights_update_group`, `/update_weights_from_distributed`): a
   process group outside `torch.distributed`'s default world, with SGLang's rendezvous
   (`sglang.srt.utils.common.init_custom_process_group`, which its model runner's
   `init_weights_update_group` calls with `init_method="tcp://master_address:master_port"`): a
   `TCPStore` served by rank 0 (the trainer), wrapped first in `PrefixStore(group_name)` (SGLang's
   own prefix) and then, as torch's `_new_process_group_helper` does for a group named
   `group_name`, in `PrefixStore("{group_name}/")` and `PrefixStore("{device}/")` (device "cpu" for
   gloo, "cuda" for nccl). The engine joins as rank `rank_offset` (+ its TP rank); tensors are
   broadcast from rank 0 one by one, in the order of the request's `names`.

Imports torch only (utils layer).
"""

from __future__ import annotations

import dataclasses
import datetime

import torch
import torch.distributed as dist

from slime.utils.fp8 import wire_view
from slime.utils.rendezvous import is_loopback, loopback_gloo_device, store_for_group


def _gloo(store, rank: int, size: int, timeout: datetime.timedelta, loopback: bool):
    if not loopback:
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupGloo._Options()  # gloo listening on 127.0.0.1, not the host name's address
    options._timeout, options._devices = timeout, [loopback_gloo_device()]
    return dist.ProcessGroupGloo(store, rank, size, options)


def _nccl(store, rank: int, size: int, timeout: datetime.timedelta, loopback: bool):
    options = dist.ProcessGroupNCCL.Options()  # what torch's group helper passes by default
    options.is_high_priority_stream = False
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, options)


_BACKENDS = {"gloo": ("cpu", _gloo), "nccl": ("cuda", _nccl)}  # backend -> (store device prefix, factory)


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
        if self.pg is None:
            raise RuntimeError(f"weight update group {self.name!r} was destroyed")
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([wire_view(tensor, self.device)], opts).wait()  # float8 as bytes on gloo

    def destroy(self, abort: bool = False) -> None:
        """Release the group: shut its backend down (`abort=True` when a peer is gone and may never
        answer) and close the store (rank 0's TCPStore server and its port go with it). Idempotent."""
        pg, self.pg, self.store = self.pg, None, None
        if pg is not None:
            (pg.abort if abort else pg.shutdown)()


def init_weight_update_group(master_address: str, master_port: int, rank: int, world_size: int,
                             group_name: str, backend: str = "gloo", timeout_s: float = 300.0) -> WeightUpdateGroup:
    """Create (rank 0) or join (rank > 0) a weight-update group; blocks until all ranks joined.

    Every rank must call this concurrently (rank 0 serves the TCPStore at master_port). The keys
    match SGLang's `init_custom_process_group(backend, init_method="tcp://...", world_size, rank,
    group_name)`, so an SGLang engine and this function form one group. Rank 0 serves the store
    on `master_address` only (`slime.utils.rendezvous.store_for_group`), and gloo listens on
    loopback when that address is loopback.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"weight update backend {backend!r} is not supported; use one of {sorted(_BACKENDS)}")
    device, make = _BACKENDS[backend]
    timeout = datetime.timedelta(seconds=timeout_s)
    store = store_for_group(master_address, master_port, world_size, rank == 0, timeout)
    sglang_prefixed = dist.PrefixStore(group_name, store)  # init_custom_process_group's own prefix
    prefixed = dist.PrefixStore(f"{device}/", dist.PrefixStore(f"{group_name}/", sglang_prefixed))
    pg = make(prefixed, rank, world_size, timeout, is_loopback(master_address))
    return WeightUpdateGroup(group_name, rank, world_size, device, pg, store)
