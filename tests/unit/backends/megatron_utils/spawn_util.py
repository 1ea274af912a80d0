"""Run a function in fresh processes (one per rank) with a gloo-ready environment.

megatron-core keeps global parallel state and our CPU patches are process-wide, so
tests that build models run their work in spawned children, never in the pytest
process. Results come back through ``torch.save`` files.
"""

import os
from pathlib import Path

import torch
import torch.multiprocessing as mp

from slime.utils.misc import free_port


def _entry(rank, fn, world_size, port, out_dir, kwargs):
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    result = fn(rank, world_size, **kwargs)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


def spawn(fn, world_size: int, out_dir, **kwargs) -> list:
    """Run ``fn(rank, world_size, **kwargs)`` in ``world_size`` processes; results by rank."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_entry, args=(fn, world_size, free_port(), str(out_dir), kwargs), nprocs=world_size)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
