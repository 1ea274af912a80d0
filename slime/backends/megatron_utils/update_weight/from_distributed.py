"""Weight sync over a broadcast group between the trainer's sending rank and every engine.

Owns `UpdateWeightFromDistributed`. `connect()` builds, per sending rank (one per pipeline stage),
a standalone group outside `torch.distributed`'s default world (`slime.utils.weight_transport`:
a TCPStore served by the trainer + ProcessGroupGloo/NCCL, with the store prefixes of SGLang's
`init_custom_process_group`, which the local engine shares): the trainer is rank 0, engine i's ranks start at 1 + sum of the TP sizes of engines < i,
world size = 1 + the sum of all engines' TP sizes. Megatron's groups are untouched. Per bucket,
the sender POSTs /update_weights_from_distributed {names, dtypes, shapes, group_name,
weight_version, load_format "flattened_bucket"} to every engine and broadcasts ONE uint8 tensor
from rank 0 while the engines receive: the bucket's bytes, tensor after tensor in `names` order
(SGLang 0.5.15.post1 and 0.5.23 both receive this format: `FlattenedTensorBucket`; the tensors go
in order of decreasing element size, so each starts aligned: `tensor_payload.flatten_unpadded`).
One broadcast per bucket instead of one per tensor (69 -> 1 per sync for the tiny MoE).
`disconnect()` destroys the group on both sides (ours even when an engine is gone).

With pipeline parallelism there is one sender (and group) per stage, and the stages run
concurrently; an engine serves weight requests one at a time, so engine A could enter stage 0's
broadcast while engine B enters stage 1's, each waiting for the other: a deadlock. Every transfer
that engines serve in order (joining the group, each bucket, dropping the group) is therefore
done under the role's cluster-wide `lock` (`common.StoreLock` for megatron ranks), as slime
serialises every bucket behind one lock.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from urllib.parse import urlparse

import aiohttp
import torch

from slime.backends.megatron_utils.update_weight.common import TrainerRole, WeightSender, run_on_engines
from slime.utils.engine_client import EngineHTTPError
from slime.utils.tensor_payload import FLATTENED_BUCKET, flatten_unpadded
from slime.utils.weight_transport import init_weight_update_group
from slime.utils.misc import free_port

logger = logging.getLogger(__name__)


def address_towards(url: str) -> str:
    """This host's IP address on the route to `url`'s host ("127.0.0.1" for loopback engines)."""
    host = urlparse(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # UDP connect sends nothing; it only picks the outgoing interface
        return s.getsockname()[0]


def engine_tp_sizes(urls: list[str], timeout: float = 60.0) -> list[int]:
    """Ranks each engine joins a group with: its /get_server_info `tp_size` (1 when absent)."""
    async def one(client, _i):
        info = await client.get_server_info()
        return int(info.get("tp_size") or 1)

    return run_on_engines(urls, one, timeout)


def _in_thread(fn, *args) -> tuple[threading.Thread, list]:
    """Start `fn(*args)` in a daemon thread; the list receives ("ok", result) or ("error", exc)."""
    box: list = []

    def target():
        try:
            box.append(("ok", fn(*args)))
        except BaseException as exc:  # handed to the caller through `box`
            box.append(("error", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _join(thread: threading.Thread, box: list, what: str):
    thread.join()
    kind, value = box[0]
    if kind == "error":
        raise RuntimeError(f"{what} failed on the trainer side: {value}") from value
    return value


class UpdateWeightFromDistributed(WeightSender):
    """Broadcast sender (disaggregated engines). `backend` "gloo" (CPU) or "nccl" (CUDA tensors);
    default: "nccl" when CUDA is available. Call `connect()` once before `update_weights`."""

    ENDPOINT = "update_weights_from_distributed"

    def __init__(self, engine_urls, buckets, role: TrainerRole = TrainerRole(), timeout: float = 600.0,
                 backend: str | None = None, master_address: str | None = None) -> None:
        super().__init__(engine_urls, buckets, role, timeout)
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.master_address = master_address or address_towards(self.engine_urls[0])
        self.group_name = f"slime-weights-{self.role.stage_tag}"
        self.group = None

    def connect(self) -> None:
        """Create this sender's group with every engine (sender ranks only; others do nothing)."""
        if not self.role.is_sender:
            return
        if self.group is not None:
            raise RuntimeError(f"weight update group {self.group_name} is already connected")
        sizes = engine_tp_sizes(self.engine_urls, self.timeout)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        world, port = 1 + sum(sizes), free_port(self.master_address)
        with self.role.lock():
            thread, box = _in_thread(init_weight_update_group, self.master_address, port, 0, world,
                                     self.group_name, self.backend, self.timeout)
            self.on_engines(lambda c, i: c.init_weights_update_group(
                self.master_address, port, offsets[i], world, self.group_name, self.backend))
            self.group = _join(thread, box, f"joining weight update group {self.group_name}")
        logger.info("weight update group %s: %d engine rank(s) at %s:%d via %s", self.group_name,
                    world - 1, self.master_address, port, self.backend)

    def disconnect(self) -> None:
        """Ask every engine to drop the group, then destroy ours (its backend shut down, rank 0's
        TCPStore and port released), whatever the engines answered. An engine that does not
        answer, or no longer knows the group (it died and `--use-fault-tolerance` restarted it at
        another URL, which is why the sender is being rebuilt), is logged and skipped; our backend
        is then aborted rather than shut down, since that peer may never take part again."""
        if self.group is None:
            return
        gone: list[str] = []

        async def drop(client, _i):
            try:
                return await client.destroy_weights_update_group(self.group_name)
            except (aiohttp.ClientError, asyncio.TimeoutError, EngineHTTPError) as exc:  # fault tolerance
                logger.warning("engine %s unreachable while dropping %s: %s", client.base_url, self.group_name, exc)
                gone.append(client.base_url)
                return None

        try:
            with self.role.lock():
                self.on_engines(drop)
        finally:
            group, self.group = self.group, None
            group.destroy(abort=bool(gone))
            logger.info("weight update group %s destroyed", self.group_name)

    def send_bucket(self, bucket: list, version: str) -> None:
        """POST the bucket's metadata to every engine while broadcasting its tensors from rank 0,
        holding the cluster-wide lock (see the module docstring)."""
        if self.group is None:
            raise RuntimeError("UpdateWeightFromDistributed.update_weights called before connect()")
        device = "cuda" if self.group.device == "cuda" else "cpu"
        flattened, metadata = flatten_unpadded((n, t.to(device)) for n, t in bucket)
        names = [m.name for m in metadata]
        dtypes = [str(m.dtype).removeprefix("torch.") for m in metadata]
        shapes = [list(m.shape) for m in metadata]
        with self.role.lock():
            thread, box = _in_thread(self.group.broadcast, flattened, 0)
            self.on_engines(lambda c, _i: c.update_weights_from_distributed(
                names, dtypes, shapes, self.group_name, flush_cache=False, weight_version=version,
                load_format=FLATTENED_BUCKET))
            _join(thread, box, f"broadcasting {len(names)} tensors ({flattened.numel()} bytes) on {self.group_name}")
