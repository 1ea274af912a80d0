"""Weight sync for engines on the trainer's host (colocated): tensors through shared memory.

Owns `UpdateWeightFromTensor`. Per bucket, the sender writes the tensors as one safetensors file
under /dev/shm (`slime.utils.weight_transport.write_shm_named_tensors`, the handle format the
local engine's /update_weights_from_tensor reads), POSTs the handle to every engine (one entry per
engine TP rank, all pointing at the same file) and deletes the file once every engine answered.
"""

from __future__ import annotations

import logging
import os

from slime.backends.megatron_utils.update_weight.common import TrainerRole, WeightSender
from slime.backends.megatron_utils.update_weight.from_distributed import engine_tp_sizes
from slime.utils.weight_transport import write_shm_named_tensors

logger = logging.getLogger(__name__)


class UpdateWeightFromTensor(WeightSender):
    """Shared-memory sender: engines must run on this host (they open the file by path)."""

    def __init__(self, engine_urls, buckets, role: TrainerRole = TrainerRole(), timeout: float = 600.0,
                 shm_dir: str = "/dev/shm") -> None:
        super().__init__(engine_urls, buckets, role, timeout)
        self.shm_dir = shm_dir
        self._tp_sizes: list[int] | None = None

    def send_bucket(self, bucket: list, version: str) -> None:
        """Write the bucket to shared memory, POST its handle to every engine, delete the file."""
        if self._tp_sizes is None:
            self._tp_sizes = engine_tp_sizes(self.engine_urls, self.timeout)
        handle, path = write_shm_named_tensors(dict(bucket), self.shm_dir)
        try:
            self.on_engines(lambda c, i: c.update_weights_from_tensor(
                [handle] * self._tp_sizes[i], flush_cache=False, weight_version=version))
        finally:  # the sender owns the file whether or not the engines took it
            os.remove(path)
