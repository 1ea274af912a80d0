"""Weight sync for engines on the trainer's own devices (colocated), in SGLang's wire format.

Owns `UpdateWeightFromTensor` and `engine_rank_groups`. Engine e runs on devices
[e * G, (e + 1) * G) of the colocated placement (G = --rollout-num-gpus-per-engine), where trainer
rank r holds device r; those trainer ranks form engine e's gather group (a gloo group, created at
`connect()`). Per bucket every member flattens the bucket on its own device and serializes it
(`slime.utils.tensor_payload`: CUDA tensors become CUDA IPC handles, CPU tensors shared-memory
files); the group gathers the entries to its first rank, which POSTs /update_weights_from_tensor
{serialized_named_tensors: entry of member i at index i, load_format "flattened_bucket",
flush_cache, weight_version}: engine TP rank i reads the payload made on the device it runs on.
The first rank then tells the members the outcome, and only then do they drop their tensors
(the engine maps their memory; SGLang answers once its scheduler has loaded the bucket). Dropped
CUDA tensors that were shared by IPC wait in torch's IPC limbo until the engine released its
mapping: every rank then runs `torch.cuda.ipc_collect()` and `empty_cache()` after each bucket, as
slime does, so a bucket's memory is back before the next one is built. Every rank of a pipeline
stage holds the same buckets; with pipeline parallelism `build_weight_sender` widens them to every
stage's (`pipeline`), so each device serializes the whole model.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from slime.backends.megatron_utils.update_weight.common import TrainerRole, WeightSender, run_on_engines
from slime.utils.tensor_payload import FLATTENED_BUCKET, serialize_flattened_bucket, use_file_system_sharing

logger = logging.getLogger(__name__)


def engine_rank_groups(num_engines: int, gpus_per_engine: int, world_size: int) -> list[list[int]]:
    """Trainer ranks on each engine's devices: engine e -> [e*G, (e+1)*G) within the world."""
    if gpus_per_engine < 1:
        raise ValueError(f"--rollout-num-gpus-per-engine must be >= 1, got {gpus_per_engine}")
    groups = [[r for r in range(e * gpus_per_engine, (e + 1) * gpus_per_engine) if r < world_size]
              for e in range(num_engines)]
    empty = [e for e, g in enumerate(groups) if not g]
    if empty:
        raise ValueError(f"engines {empty} run on no trainer rank's device: colocated engines need "
                         f"--rollout-num-gpus <= the trainer's GPUs ({world_size})")
    return groups


def release_ipc_memory() -> None:
    """Free CUDA blocks whose IPC consumers are done (torch keeps a shared block in limbo until the
    consumer released it) and return cached blocks to the device; a no-op without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()


@dataclasses.dataclass
class _Membership:
    """This rank's engine, its gather group's ranks (first = the one that POSTs) and gloo group."""

    engine: int
    ranks: list[int]
    group: object  # None when the group has one rank

    def gather(self, entry: str, rank: int) -> list[str] | None:
        """Every member's entry in rank order on the first rank; None elsewhere."""
        if self.group is None:
            return [entry]
        from slime.backends.megatron_utils import collectives

        return collectives.gather_object(entry, dst=self.ranks[0], group=self.group)

    def settle(self, error: BaseException | None, rank: int) -> None:
        """Share the POST's outcome from the first rank; every member raises if it failed."""
        outcome = [repr(error) if error is not None else None]
        if self.group is not None:
            from slime.backends.megatron_utils import collectives

            collectives.broadcast_object_list(outcome, src=self.ranks[0], group=self.group)
        if error is not None:
            raise error
        if outcome[0] is not None:
            raise RuntimeError(f"engine {self.engine} (talked to by trainer rank {self.ranks[0]}) failed: {outcome[0]}")


class UpdateWeightFromTensor(WeightSender):
    """Colocated sender. `gpus_per_engine` = --rollout-num-gpus-per-engine; every trainer rank on
    an engine's devices takes part (the role's `is_sender` is ignored). Call `connect()` first."""

    ENDPOINT = "update_weights_from_tensor"

    def __init__(self, engine_urls, buckets, role: TrainerRole = TrainerRole(), timeout: float = 600.0,
                 gpus_per_engine: int = 1) -> None:
        super().__init__(engine_urls, buckets, dataclasses.replace(role, is_sender=True), timeout)
        self.gpus_per_engine = int(gpus_per_engine)
        self._member: _Membership | None = None
        self._rank = 0
        self._connected = False

    def connect(self) -> None:
        """Create every engine's gather group (collective over all trainer ranks: torch's
        `new_group` needs every rank) and check each engine has no more TP ranks than members."""
        import torch.distributed as dist

        from slime.backends.megatron_utils import collectives

        if self._connected:
            raise RuntimeError("UpdateWeightFromTensor is already connected")
        if not torch.cuda.is_available():
            use_file_system_sharing()  # CPU tensors cross to the engine by file name (tensor_payload)
        distributed = dist.is_available() and dist.is_initialized()
        self._rank = dist.get_rank() if distributed else 0
        world = dist.get_world_size() if distributed else 1
        for engine, ranks in enumerate(engine_rank_groups(len(self.engine_urls), self.gpus_per_engine, world)):
            group = collectives.new_host_group(ranks, f"weight_gather_engine{engine}") \
                if distributed and len(ranks) > 1 else None
            if self._rank in ranks:
                self._member = _Membership(engine, ranks, group)
        if self._member is not None:  # the first rank checks the engine; every member learns the outcome
            error = None
            if self._rank == self._member.ranks[0]:
                try:
                    self._check_tp_size()
                except ValueError as exc:
                    error = exc
            self._member.settle(error, self._rank)
        self._connected = True

    def _check_tp_size(self) -> None:
        from slime.backends.megatron_utils.update_weight.from_distributed import engine_tp_sizes

        url = self.engine_urls[self._member.engine]
        (tp,) = engine_tp_sizes([url], self.timeout)
        if tp > len(self._member.ranks):
            raise ValueError(f"engine {url} has tp_size {tp} but only trainer ranks {self._member.ranks} share "
                             f"its devices: set --rollout-num-gpus-per-engine to the engine's GPU count")

    def disconnect(self) -> None:
        """Forget the groups (torch keeps them until the process group is destroyed)."""
        self._member, self._connected = None, False

    def send_bucket(self, bucket: list, version: str) -> None:
        """Serialize the bucket on this rank's device, gather to the engine's first rank, POST,
        share the outcome; the tensors stay alive until the engine answered."""
        if not self._connected:
            raise RuntimeError("UpdateWeightFromTensor.update_weights called before connect()")
        if self._member is None:  # no engine on this rank's device
            return
        entry, keep_alive = serialize_flattened_bucket(bucket)
        entries = self._member.gather(entry, self._rank)
        error = None
        if entries is not None:
            url = self.engine_urls[self._member.engine]
            try:
                run_on_engines([url], lambda c, _i: c.update_weights_from_tensor(
                    entries, load_format=FLATTENED_BUCKET, flush_cache=False, weight_version=version), self.timeout)
            except Exception as exc:  # shared with the members below, then raised on every one
                error = exc
        try:
            self._member.settle(error, self._rank)
        finally:
            del keep_alive, entry, entries
            release_ipc_memory()
