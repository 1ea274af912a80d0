"""Every torch.distributed collective our trainer code issues, with tensors on the right device.

Why this module exists (docs/gpu-guide.md, "Collectives and devices"): on GPU the default process
group is NCCL (`--distributed-backend nccl`) and megatron's groups inherit it, so a host (CPU)
tensor in a collective on them raises "No backend type associated with device type cpu". On CPU
every group is gloo, which takes any tensor, so a forgotten `.to(device)` passes every CPU test and
stops the first GPU run. Two rules close that gap:

1. Our code calls collectives only through this module (`tests/unit/test_import_rules.py` forbids
   raw `torch.distributed` collectives and `new_group` elsewhere in `slime/`).
2. A tensor entering a collective on a *device group* (every group but the host groups below) must
   have been placed by `to_device` (or allocated here). On GPU that means it is on
   `torch.cuda.current_device()`; on CPU, where host and device are the same memory, `to_device`
   returns a marked alias of the tensor and the collective refuses an unmarked one. So a CPU run
   fails exactly where the GPU run would, and more strictly: a tensor computed from a placed one is
   unmarked and must be placed again (a no-op copy-free `.to` on GPU).

Host groups are gloo groups made for host data on purpose: megatron's `*_GLOO` groups and ours
from `new_host_group`. They are told apart by their torch group description (ProcessGroup objects
take no attributes), so no registry is kept. Object collectives (`*_object`) take any group: torch
pickles the objects into tensors on the group's own device.

Tensor collectives are in place, like torch's, and return the tensor(s) for chaining.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

HOST_GROUP_PREFIX = "SLIME_HOST_"
_PLACED = "_slime_placed_on_device"  # attribute marking a CPU-run tensor placed by to_device
_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


class HostTensorInCollective(RuntimeError):
    """A tensor not placed on the device entered a collective on a device (NCCL on GPU) group."""


def device() -> torch.device:
    """The device of collectives on device groups: `cuda:<current>` with CUDA, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on `device()` (no copy when it is already there), accepted by device-group collectives.

    On CPU runs the result is a marked alias (`view_as`) sharing storage with `tensor`: in-place
    collectives on it update `tensor` too, as they do on GPU for a tensor already on the device.
    Use the returned tensor: on GPU a host tensor is copied, and the collective writes the copy."""
    if torch.cuda.is_available():
        return tensor.to(device())
    if getattr(tensor, _PLACED, False):
        return tensor
    alias = tensor.view_as(tensor)
    setattr(alias, _PLACED, True)
    return alias


def device_tensor(data, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.as_tensor(data, dtype=dtype)` placed on the device (`to_device`)."""
    return to_device(torch.as_tensor(data, dtype=dtype))


def new_host_group(ranks: list[int], name: str):
    """A gloo group over `ranks` for host data (collective over the whole world, like `new_group`);
    collectives on it take host tensors on every device."""
    return dist.new_group(ranks, backend="gloo", group_desc=HOST_GROUP_PREFIX + name)


def is_host_group(group) -> bool:
    """True for gloo groups made for host data: ours (`new_host_group`) and megatron's `*_GLOO` ones."""
    if group is None:
        return False
    desc = str(getattr(group, "group_desc", "") or "")
    return desc.startswith(HOST_GROUP_PREFIX) or desc.endswith("_GLOO")


def _group_name(group) -> str:
    return "the default group" if group is None else repr(getattr(group, "group_desc", None) or group)


def check_placed(tensor: torch.Tensor, group, what: str) -> None:
    """Raise `HostTensorInCollective` when `tensor` may not enter collective `what` on `group`."""
    if is_host_group(group):
        return
    ok = tensor.device == device() if torch.cuda.is_available() else getattr(tensor, _PLACED, False)
    if not ok:
        raise HostTensorInCollective(
            f"{what} on {_group_name(group)}: a tensor on {tensor.device} that was not placed with "
            "collectives.to_device; on GPU this group is NCCL and refuses host tensors "
            "(\"No backend type associated with device type cpu\")")


def _op(op: str):
    if op not in _OPS:
        raise ValueError(f"unknown reduce op {op!r}; use one of {sorted(_OPS)}")
    return getattr(dist.ReduceOp, _OPS[op])


def all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """In-place all-reduce (`op`: sum, max, min, product) of a placed tensor; returns it."""
    check_placed(tensor, group, f"all_reduce({op})")
    dist.all_reduce(tensor, op=_op(op), group=group)
    return tensor


def broadcast(tensor: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """In-place broadcast from global rank `src` of a placed tensor; returns it."""
    check_placed(tensor, group, "broadcast")
    dist.broadcast(tensor, src=src, group=group)
    return tensor


def all_gather(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every rank's `tensor` of `group` in rank order (outputs allocated on the tensor's device and
    placed); `[tensor]` when the group has one rank (checked all the same: the layout that runs
    on one rank here may run on several on GPU)."""
    check_placed(tensor, group, "all_gather")
    size = dist.get_world_size(group=group)
    if size == 1:
        return [tensor]
    tensor = tensor.contiguous()
    out = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(out, tensor, group=group)
    return [t if is_host_group(group) else to_device(t) for t in out]


def barrier(group=None) -> None:
    """Wait for every rank of `group`."""
    dist.barrier(group=group)


def broadcast_object_list(objects: list, src: int, group=None) -> list:
    """Picklable objects from global rank `src`, in place in `objects`; returns it."""
    dist.broadcast_object_list(objects, src=src, group=group)
    return objects


def all_gather_object(obj, group=None) -> list:
    """Every rank's picklable `obj` of `group`, in rank order."""
    out = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(out, obj, group=group)
    return out


def gather_object(obj, dst: int, group=None) -> list | None:
    """Every rank's `obj` on global rank `dst` (rank order); None on the other ranks."""
    out = [None] * dist.get_world_size(group=group) if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst, group=group)
    return out
