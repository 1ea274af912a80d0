"""torch.distributed and megatron parallel_state initialisation.

Owns process-group start-up for the Megatron backend: gloo on CPU, nccl on GPU,
``env://`` (torchrun) or explicit rank / world size / master address; megatron's
TP / PP / CP / EP / ETP groups; and the model-parallel RNG seeding (megatron's
``model_parallel_cuda_manual_seed`` on GPU, its CPU equivalent otherwise).
"""

import argparse
import datetime
import logging
import os
import random
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from slime.utils.misc import free_port
from slime.utils.rendezvous import agent_serves_store, gloo_device_env, store_for_group

logger = logging.getLogger(__name__)


def megatron_parallel_state():
    """megatron.core's parallel_state, imported on first use (megatron stays out of module imports)."""
    from megatron.core import parallel_state

    return parallel_state


def default_backend() -> str:
    """``nccl`` when CUDA is available, ``gloo`` otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    backend: Optional[str] = None,
    timeout_minutes: int = 30,
) -> None:
    """Initialise the default process group once (idempotent).

    Without explicit ``rank`` / ``world_size`` it reads torchrun's ``RANK`` / ``WORLD_SIZE``
    (defaulting to a single process on 127.0.0.1 when they are absent). Rank 0's rendezvous
    store listens on ``master_addr`` only, and gloo on loopback when that is loopback
    (``slime.utils.rendezvous``: torch's store has no authentication; docs/security.md).
    """
    if dist.is_initialized():
        return
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    master_addr = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    master_port = master_port or int(os.environ.get("MASTER_PORT", free_port()))
    backend = backend or default_backend()
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(local_rank)
    timeout = datetime.timedelta(minutes=timeout_minutes)
    os.environ.update(gloo_device_env(master_addr, os.environ))
    dist.init_process_group(
        backend=backend,
        store=store_for_group(master_addr, master_port, world_size,
                              rank == 0 and not agent_serves_store(os.environ), timeout),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    logger.info("process group up: rank %d/%d backend %s, rendezvous %s:%d", rank, world_size, backend,
                master_addr, master_port)


def check_cpu_parallel_sizes(args: argparse.Namespace) -> None:
    """Raise when a layout cannot run without CUDA.

    Context parallel needs TE attention; the ``alltoall`` / ``flex`` MoE token dispatchers
    create and use CUDA streams (megatron-core 0.16.1), the ``allgather`` one runs on CPU.
    """
    if torch.cuda.is_available():
        return
    if (getattr(args, "context_parallel_size", 1) or 1) > 1:
        raise ValueError(
            f"--context-parallel-size {args.context_parallel_size} needs Transformer Engine "
            "attention, which runs on GPU only; use --context-parallel-size 1 on CPU"
        )
    dispatcher = getattr(args, "moe_token_dispatcher_type", "allgather") or "allgather"
    if getattr(args, "num_experts", None) and dispatcher != "allgather":
        raise ValueError(
            f"--moe-token-dispatcher-type {dispatcher} uses CUDA streams and runs on GPU only; "
            "use --moe-token-dispatcher-type allgather on CPU"
        )


def initialize_model_parallel(args: argparse.Namespace) -> None:
    """Create megatron's parallel_state groups from ``--*-model-parallel-size`` flags.

    The default process group must already exist; world size must be divisible by
    TP * PP * CP (megatron checks the rest).
    """
    from megatron.core import parallel_state as mpu

    check_cpu_parallel_sizes(args)
    if mpu.model_parallel_is_initialized():
        return
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=getattr(args, "tensor_model_parallel_size", 1) or 1,
        pipeline_model_parallel_size=getattr(args, "pipeline_model_parallel_size", 1) or 1,
        virtual_pipeline_model_parallel_size=getattr(
            args, "virtual_pipeline_model_parallel_size", None
        ),
        context_parallel_size=getattr(args, "context_parallel_size", 1) or 1,
        expert_model_parallel_size=getattr(args, "expert_model_parallel_size", 1) or 1,
        expert_tensor_parallel_size=getattr(args, "expert_tensor_parallel_size", None),
        distributed_timeout_minutes=_timeout_minutes(args),
    )


def _timeout_minutes(args: argparse.Namespace) -> int:
    """``--distributed-timeout-minutes``: the timeout of the default group and megatron's groups."""
    return getattr(args, "distributed_timeout_minutes", None) or 10


def set_random_seed(seed: int) -> None:
    """Seed python / numpy / torch and megatron's model-parallel RNG tracker.

    Megatron offsets the seed per PP stage (``seed + 100 * pp_rank``) as Megatron-LM does,
    and registers the tensor-/expert-parallel RNG states so dropout and init differ per
    TP / EP rank where they should. On CPU the tracker's states are CPU RNG states.
    """
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    seed = seed + 100 * mpu.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    _cpu_model_parallel_seed(seed)


def _cpu_model_parallel_seed(seed: int) -> None:
    """CPU twin of ``model_parallel_cuda_manual_seed``: same seeds, CPU generator states."""
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import random as mp_random

    tp_seed = seed + 2718 + mpu.get_tensor_model_parallel_rank()
    ep_seed = (
        seed + 1024 + 100 * mpu.get_expert_model_parallel_rank()
        + mpu.get_expert_tensor_parallel_rank()
    )
    tracker = mp_random.get_cuda_rng_tracker()
    tracker.reset()
    for name, value in (
        (mp_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed),
        (mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME, tp_seed),
        (mp_random._EXPERT_PARALLEL_RNG_TRACKER_NAME, ep_seed),
    ):
        saved = torch.get_rng_state()
        torch.manual_seed(value)
        tracker.states_[name] = torch.get_rng_state()
        tracker.seeds_.add(value)
        torch.set_rng_state(saved)
    torch.manual_seed(seed)


def apply_upstream_patches(cuda_available: bool) -> dict:
    """The named megatron-core patches this machine needs, applied: those for absent Transformer
    Engine / Apex on any machine (``te_absent``), and without CUDA the CPU ones too (``cpu_compat``).
    Returns ``{name: changed}``."""
    if cuda_available:
        from slime.backends.megatron_utils.te_absent import apply_te_absent_patches

        return apply_te_absent_patches()
    from slime.backends.megatron_utils.cpu_compat import apply_cpu_compat

    return apply_cpu_compat()


def initialize_megatron(args: argparse.Namespace, **process_group_kwargs) -> None:
    """Full backend start-up: process group (timeout ``--distributed-timeout-minutes``), the named
    upstream patches (``apply_upstream_patches``), groups, seeds, then
    ``--custom-megatron-init-path`` (slime's call site)."""
    process_group_kwargs.setdefault("timeout_minutes", _timeout_minutes(args))
    init_process_group(
        backend=getattr(args, "distributed_backend", None) if torch.cuda.is_available() else "gloo",
        **process_group_kwargs,
    )
    apply_upstream_patches(torch.cuda.is_available())
    initialize_model_parallel(args)
    set_random_seed(getattr(args, "seed", 1234) or 1234)
    if getattr(args, "custom_megatron_init_path", None):
        from slime.utils.misc import load_function
        from slime.utils.plugins import call_megatron_init

        call_megatron_init(load_function(args.custom_megatron_init_path), args)


def destroy_parallel() -> None:
    """Tear down megatron groups and the default process group (tests, tools)."""
    from megatron.core import parallel_state as mpu

    mpu.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
