"""The Megatron-LM ``torch_dist`` checkpoint layout and the writer every save goes through.

Layout (`slime.utils.checkpoint_layout`): ``{save}/iter_{iteration:07d}/`` holds the
dist_checkpointing files and ``{save}/latest_checkpointed_iteration.txt`` the iteration (or
``release``, naming ``{save}/release/``: slime's converter output). A save is written into
``{save}/.saving-iter_{iteration:07d}/``, renamed into place by rank 0 after every rank finished
and megatron wrote its metadata, and only then is the tracker replaced (temp file + rename), so an
interrupted save leaves the previous checkpoint and tracker intact; the common state carries ``checkpoint_version`` (3.0), ``iteration`` and ``args`` (a
Namespace of plain values without secrets: Megatron-LM readers use getattr on it). Trainer
checkpoints (`checkpoint.py`) and the HF converter (`hf_convert.py`) both write through
`write_torch_dist`.

Save strategy. megatron-core's default torch_dist writer (`FileSystemWriterAsync`) creates a
`multiprocessing.Manager` with the *spawn* start method for its results queue (once per process)
and then *forks* one writer process per file, and the parent waits on a joinable queue that each
child marks done. It can hang three ways, the first two seen here: (1) the spawn re-imports the
caller's `__main__` (a script without a `__main__` guard hangs there: DESIGN.md section 2); (2)
the forked writer calls `_process_memory()`, which raises without `psutil` (not installed here)
*before* its try block, so the child dies without marking the queue and the parent waits forever
(seen: a 1-rank `dist_checkpointing.save` with the default strategy never returns); (3) forking a
process that runs many threads (Ray actor workers, gloo's threads) can leave the child holding a
lock no thread will release. `thread_count=1` avoids none of them (it only makes one bucket).
`in_process_save_strategy()` keeps megatron's planning, deduplication, metadata and file format
(loaded by megatron's default torch_dist load strategy, any layout) but writes this rank's single
file in the calling process: no Manager, no fork. With `background=True` (`--async-save`) the
planning and a CPU snapshot of every tensor happen in the call, the file is written by a thread of
this process, and `PendingSave.finalize()` (collective) joins it, lets megatron write the global
metadata and only then renames the folder into place and points the tracker at it: a checkpoint
named by the tracker is always complete.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from slime.backends.megatron_utils import collectives
from slime.utils.arguments.logger import is_secret_dest
from slime.utils.checkpoint_layout import (  # noqa: F401  (the layout's names, re-exported)
    TRACKER_FILE,
    iteration_dir,
    prepare_staging,
    publish,
    read_tracker,
    staging_dir,
)

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 3.0
_PLAIN = (str, int, float, bool, type(None))


def plain_args(args: argparse.Namespace, **extra) -> argparse.Namespace:
    """Copy of `args` with plain values only (lists/tuples of plain values kept), secrets dropped,
    `extra` added (the saver adds `world_size`)."""
    out = {}
    for key, value in vars(args).items():
        if is_secret_dest(key):
            continue
        plain_list = isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value)
        if isinstance(value, _PLAIN) or plain_list:
            out[key] = value
    out.update(extra)
    return argparse.Namespace(**out)


def _own_storage(tensor: torch.Tensor, snapshot: bool = False) -> torch.Tensor:
    """CPU tensor whose storage is exactly its data (torch.save of a view writes the whole buffer:
    DDP parameters are views into one contiguous buffer). `snapshot`: always a copy (a background
    write must not see the training that goes on meanwhile)."""
    tensor = tensor.detach().to("cpu")
    whole = tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    return tensor.clone() if snapshot or not whole else tensor


def _writer_class(snapshot: bool = False):
    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        FileSystemWriterAsync,
        _split_by_size_and_type,
    )
    from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, SerializationFormat, _write_item
    from torch.distributed.checkpoint.planner import WriteItemType

    class InProcessWriter(FileSystemWriterAsync):
        """One file per rank, written by the calling process (see the module docstring)."""

        def prepare_write_data(self, plan, planner) -> None:
            prefix = plan.storage_data.prefix
            self.write_buckets = []
            for bucket in (b for b in _split_by_size_and_type(1, plan.items) if b):
                name = f"{prefix}{len(self.write_buckets)}{DEFAULT_SUFFIX}"
                data = [(item, planner.resolve_data(item)) for item in bucket]
                as_bytes = [(i, d) for i, d in data if i.type == WriteItemType.BYTE_IO]
                tensors = [(i, _own_storage(d, snapshot)) for i, d in data if i.type != WriteItemType.BYTE_IO]
                self.write_buckets.append((str(Path(self.checkpoint_dir) / name), name, (as_bytes, tensors)))
            self.results_queue = queue.Queue()

        def get_save_function_and_args(self):
            return self._write_all, None, []

        def _write_all(self) -> None:
            results = {}
            for idx, (path, storage_key, (as_bytes, tensors)) in enumerate(self.write_buckets):
                with open(path, "wb") as stream:
                    results[idx] = [_write_item(self.transforms, stream, data, item, storage_key,
                                                           SerializationFormat.TORCH_SAVE)
                                    for item, data in as_bytes + tensors]
                    os.fsync(stream.fileno())
            self.results_queue.put(results)

    return InProcessWriter


def in_process_save_strategy(snapshot: bool = False):
    """megatron-core torch_dist save strategy whose writes stay in this process (no Manager/fork);
    `snapshot`: copy every tensor at planning time (for a background write)."""
    from megatron.core.dist_checkpointing.strategies.state_dict_saver import save_state_dict_async_plan
    from megatron.core.dist_checkpointing.strategies.torch import (
        MCoreSavePlanner,
        TorchDistSaveShardedStrategy,
        _replace_state_dict_keys_with_sharded_keys,
        mcore_to_pyt_state_dict,
    )

    writer_cls = _writer_class(snapshot)

    class InProcessTorchDistSaveStrategy(TorchDistSaveShardedStrategy):
        """TorchDistSaveShardedStrategy with `InProcessWriter` and no cached plans."""

        def async_save(self, sharded_state_dict, checkpoint_dir):
            sharded, _, _ = _replace_state_dict_keys_with_sharded_keys(sharded_state_dict, self.keep_only_main_replica)
            writer = writer_cls(checkpoint_dir, thread_count=1)
            planner = MCoreSavePlanner(dedup_replicated_tensors=not self.keep_only_main_replica,
                                       flatten_state_dict=False)
            ret = save_state_dict_async_plan(mcore_to_pyt_state_dict(sharded, False), writer, None, 0,
                                             planner=planner)
            return self._get_save_and_finalize_callbacks(writer, ret[0])

    return InProcessTorchDistSaveStrategy("torch_dist", 1, thread_count=1)


def write_torch_dist(state: dict, save_dir, iteration: int, background: bool = False):
    """Save a (sharded) state dict as ``iter_{iteration:07d}`` of ``save_dir`` and point the tracker
    file at it. Every rank calls; returns the iteration folder, or with ``background`` a
    `PendingSave` whose `finalize()` (every rank calls) completes the save and writes the tracker."""
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        prepare_staging(save_dir, iteration)
    collectives.barrier()
    staging = str(staging_dir(save_dir, iteration))
    if background:
        request = dist_checkpointing.save(state, staging, sharded_strategy=in_process_save_strategy(True),
                                          async_sharded_save=True)
        return PendingSave(request, save_dir, iteration)
    dist_checkpointing.save(state, staging, sharded_strategy=in_process_save_strategy())
    return _publish(save_dir, iteration)


def _publish(save_dir, iteration: int) -> Path:
    """Every rank finished writing: rank 0 renames the staging folder into place and writes the tracker."""
    collectives.barrier()
    if dist.get_rank() == 0:
        publish(save_dir, iteration)
    collectives.barrier()
    return iteration_dir(save_dir, iteration)


class PendingSave:
    """A torch_dist save whose files a thread of this process is writing (`--async-save`)."""

    def __init__(self, request, save_dir, iteration: int):
        self.request, self.save_dir, self.iteration = request, save_dir, iteration
        self.ckpt_dir = iteration_dir(save_dir, iteration)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._write, name=f"async-save-{iteration}", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        try:
            if self.request.async_fn is not None:
                self.request.async_fn(*self.request.async_fn_args, **self.request.async_fn_kwargs)
        except BaseException as e:  # re-raised by finalize() on every rank
            self.error = e

    def finalize(self) -> Path:
        """Wait for the write, then (collectively) megatron's metadata and the tracker file. Raises
        on every rank when the write failed on any rank (the tracker and the previous checkpoint
        are then untouched; the staging folder is removed by the next save of this iteration)."""
        self.thread.join()
        failed = collectives.device_tensor([int(self.error is not None)])
        if int(collectives.all_reduce(failed, "max")):
            raise RuntimeError(f"--async-save of {self.ckpt_dir} failed on a rank") from self.error
        for fn in self.request.finalize_fns:
            fn()
        _publish(self.save_dir, self.iteration)
        logger.info("async save of %s complete", self.ckpt_dir)
        return self.ckpt_dir


def save_model(model, args: argparse.Namespace, save_dir, iteration: int = 0) -> Path:
    """Write ``model`` (this rank's chunk) as a weights-only torch_dist checkpoint (the HF
    converter's output: model, ``args``, ``checkpoint_version``, ``iteration``); all ranks call."""
    state = {
        "args": plain_args(args),
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": iteration,
        "model": model.sharded_state_dict(),
    }
    ckpt_dir = write_torch_dist(state, save_dir, iteration)
    logger.info("saved torch_dist checkpoint %s", ckpt_dir)
    return ckpt_dir


def load_torch_dist(model, ckpt_dir) -> dict:
    """Load a torch_dist checkpoint folder into ``model`` (any saved layout -> this layout).

    Returns the common state (``args``, ``iteration``, ``checkpoint_version``).
    """
    from megatron.core import dist_checkpointing

    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / "metadata.json").is_file():
        raise FileNotFoundError(
            f"{ckpt_dir} is not a torch_dist checkpoint folder (no metadata.json); "
            "--input-dir must be <save>/iter_XXXXXXX"
        )
    metadata = dist_checkpointing.load_content_metadata(str(ckpt_dir)) or {}  # the saved model layout
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict(metadata=dict(metadata))}, str(ckpt_dir))
    missing, unexpected = model.load_state_dict(loaded["model"], strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"{ckpt_dir}: missing keys {missing}, unexpected keys {unexpected}")
    return dist_checkpointing.load_common_state_dict(str(ckpt_dir))


