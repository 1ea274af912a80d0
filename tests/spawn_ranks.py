"""Start a test's rank processes from one warm fork server per pytest session.

`torch.multiprocessing.spawn` starts every rank as a new interpreter that imports torch,
megatron-core and our backend again (about 5 s of CPU per rank, paid by every test that spawns).
`spawn_ranks` has `mp.spawn`'s signature and semantics but starts the ranks with the *forkserver*
method: a server process imports those modules once (`PRELOAD`), and each rank is a fork of it.

What a rank sees is what a spawned rank sees:
- a fresh process: the server only imports modules (megatron-core's parallel state and our CPU
  patches are set up by the rank itself, as before; nothing is initialised at import time);
- the parent's environment, working directory, stdout and stderr *at the call* (the server's own
  are those of its start; pytest captures each test's output on descriptors 1 and 2), restored
  before `fn` runs;
- `fn` and its arguments pickled as with spawn (top-level functions only).

On a machine with CUDA the ranks are spawned as before: a process that has asked the driver for
its devices (megatron-core does at import) must not be forked for ranks that use them.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import reduction

import torch.multiprocessing as mp

# Modules every rank of the megatron tests imports; a module missing here is simply imported by
# the rank itself, as under spawn.
PRELOAD = (
    "torch",
    "torch.distributed",
    "numpy",
    "megatron.core",
    "megatron.core.parallel_state",
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
    "megatron.core.dist_checkpointing",
    "slime.backends.megatron_utils.actor",
    "slime.utils.arguments",
)


def _context():
    ctx = multiprocessing.get_context("forkserver")
    # takes effect when the server starts (the first call in this process); later calls are no-ops
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


class _Descriptor:
    """A descriptor of the caller, duplicated into the rank when the rank's arguments unpickle."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _inherited, (reduction.DupFd(self.fd),)  # called while the rank starts


def _inherited(dup) -> int:
    return dup.detach()


def _as_called(rank: int, fn, env: dict[str, str], cwd: str, out: int, err: int, args: tuple) -> None:
    for fd, target in ((out, 1), (err, 2)):
        if fd != target:  # spawn passes the descriptor under its own number
            os.dup2(fd, target)
            os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fn(rank, *args)


def spawn_ranks(fn, args: tuple = (), nprocs: int = 1, join: bool = True):
    """`torch.multiprocessing.spawn(fn, args, nprocs, join)` from the warm fork server:
    `fn(rank, *args)` in `nprocs` processes; with join=False returns the ProcessContext."""
    import torch

    method = "spawn" if torch.cuda.is_available() else "forkserver"
    if method == "forkserver":
        _context()
    call = (fn, dict(os.environ), os.getcwd(), _Descriptor(1), _Descriptor(2), tuple(args))
    return mp.start_processes(_as_called, args=call, nprocs=nprocs, join=join, start_method=method)
