"""Run a function in fresh processes (one per rank) with a gloo-ready environment.

megatron-core keeps global parallel state and our CPU patches are process-wide, so
tests that build models run their work in child processes, never in the pytest
process; the children come from the session's warm fork server (`tests.spawn_ranks`).
Results come back through ``torch.save`` files.
"""

import os
from pathlib import Path

import torch
from slime.utils.misc import free_port
from tests.spawn_ranks import spawn_ranks


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
    spawn_ranks(_entry, args=(fn, world_size, free_port(), str(out_dir), kwargs), nprocs=world_size)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def spawn_until_exit(fn, args: tuple, nprocs: int, poll_s: float = 0.2) -> None:
    """`spawn_ranks(fn, args, nprocs)`, waiting for the processes to exit rather than for their
    sentinel pipes to close; raises if any rank exited non-zero.

    A rank that shares CPU tensors with the "file_system" strategy (the colocated weight sender on
    CPU) starts a torch_shm_manager, which inherits the rank's open descriptors, its sentinel pipe
    among them, and lives while a receiver (a long-lived engine) still maps its memory: the
    sentinel-based `spawn(join=True)` then waits forever after every rank has exited."""
    import time

    context = spawn_ranks(fn, args=args, nprocs=nprocs, join=False)
    while any(p.is_alive() for p in context.processes):  # waitpid, not the sentinel
        time.sleep(poll_s)
    failed = {rank: p.exitcode for rank, p in enumerate(context.processes) if p.exitcode != 0}
    if failed:
        raise RuntimeError(f"spawned rank(s) exited with {failed} (their tracebacks are in the output above)")
