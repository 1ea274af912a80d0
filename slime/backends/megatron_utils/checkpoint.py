"""Trainer checkpoints: save, resume and weights-only loads in Megatron-LM's torch_dist layout.

Owns `save_checkpoint` / `load_checkpoint` (model, optimizer, LR schedule, RNG states and the
counters of one `TrainState`), `load_model_weights` (weights only: `--ref-load`, the reference
model) and the HF export of `--save-hf`.

Layout (Megatron-LM's, `slime.utils.checkpoint_layout`): `{save}/iter_{iteration:07d}/` holds the
dist_checkpointing files and `{save}/latest_checkpointed_iteration.txt` the iteration, replaced
only once the new folder is complete (a tracker `release` names `{save}/release/`: a converted
checkpoint, loaded as weights only). The state dict keys are Megatron-LM's: `model`, `optimizer`,
`opt_param_scheduler`, `rng_state` (Megatron-LM's ShardedObject per (pp, tp), see
`sharded_rng_state`), `iteration`, `checkpoint_version` (3.0), `content_metadata` (the sharded
layout: a load requests the one the checkpoint has, see `checkpoint_metadata`), `args`; slime adds
`rollout_id` (and the trainer `step_id`). `args` is
stored as an `argparse.Namespace` (Megatron-LM readers and the converter
`tools/convert_torch_dist_to_hf.py` read it with getattr) holding plain values only, without
secrets (flags named `*key`, `*token`, `*secret`, `*password`).
The files are written by `torch_dist.write_torch_dist` (in-process, or by a background thread
with `--async-save`; see that module).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from slime.backends.megatron_utils import collectives
from slime.backends.megatron_utils.model import unwrap
from slime.backends.megatron_utils.torch_dist import (
    CHECKPOINT_VERSION,
    iteration_dir,
    load_torch_dist,
    plain_args,
    read_tracker,
    write_torch_dist,
)
from slime.utils.arguments.common import ArgumentError
from slime.utils.checkpoint_layout import RELEASE, first_launch, load_problem

logger = logging.getLogger(__name__)


# ----- pieces of the state dict ----------------------------------------------------------------
def get_rng_state() -> dict:
    """This rank's RNG states: python, numpy, torch, CUDA (when present), megatron's tracker."""
    from megatron.core import tensor_parallel

    return {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }


def set_rng_state(state: dict) -> None:
    """Restore what `get_rng_state` returned."""
    from megatron.core import tensor_parallel

    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if torch.cuda.is_available() and state.get("cuda_rng_state") is not None:
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def _rng_position() -> tuple[tuple[int, int], tuple[int, int], int, object]:
    """Megatron-LM's `rng_state` position: ((pp, tp) sizes, (pp, tp) ranks, data-parallel rank
    with context parallel, that group)."""
    from megatron.core import parallel_state as mpu

    shape = (mpu.get_pipeline_model_parallel_world_size(), mpu.get_tensor_model_parallel_world_size())
    offset = (mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_rank())
    dp_rank = mpu.get_data_parallel_rank(with_context_parallel=True)
    return shape, offset, dp_rank, mpu.get_data_parallel_group(with_context_parallel=True)


def sharded_rng_state(loading: bool = False):
    """Megatron-LM's ShardedObject `rng_state`: one object per (pp, tp) position (global shape
    (pp, tp), offset (pp rank, tp rank)), stored by data-parallel rank 0 (replica id = the
    data-parallel rank with context parallel), holding the list of the RNG states of every
    data-parallel rank there, as Megatron-LM stores it with `--data-parallel-random-init` (every
    rank's own states come back; a Megatron-LM reader without that flag takes entry 0, as it does
    for its own checkpoints). Saving gathers the list (collective over data parallel)."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    shape, offset, dp_rank, dp_group = _rng_position()
    states = None
    if not loading:
        states = collectives.all_gather_object(get_rng_state(), group=dp_group)
    return ShardedObject("rng_state", states, shape, offset, replica_id=dp_rank)


def own_rng_state(loaded) -> dict:
    """This rank's entry of a loaded `rng_state` (Megatron-LM's rule: entry `dp rank` of a list
    with one entry per data-parallel rank, else entry 0)."""
    if isinstance(loaded, dict):
        return loaded
    _, _, dp_rank, dp_group = _rng_position()
    return loaded[dp_rank] if len(loaded) == dist.get_world_size(dp_group) else loaded[0]


# The sharded-state metadata (`content_metadata`) saves write, Megatron-LM's default since 0.14: the
# distributed optimizer's state per data-parallel group (`dp_reshardable`), loadable at the same
# TP/PP/EP layout.
CONTENT_METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "chained_optim_avoid_prefix": True,
                    "singleton_local_shards": False}


# Layouts megatron-core cannot read back: 0.16 dropped `ShardedTensor.flattened_range`, which the
# pre-0.14 default `fully_sharded_model_space` is made of (Megatron-LM 0.16 fails on it too).
UNREADABLE_OPTIMIZER_LAYOUTS = ("fully_sharded_model_space",)


def checkpoint_metadata(common: dict) -> dict:
    """The sharded-state metadata a checkpoint was saved with, to request the same layout on load:
    its stored `content_metadata` (Megatron-LM >= 0.14, and ours), else what Megatron-LM's loader
    assumes for an older checkpoint (slime's Megatron-LM): the distributed optimizer in
    `fully_sharded_model_space` (`dp_zero_gather_scatter` when saved with
    `--no-ckpt-fully-parallel-save`), chained optimizers under `chained_{i}.` prefixes."""
    from megatron.core import dist_checkpointing

    stored = dist_checkpointing.load_content_metadata(preloaded_state_dict=common)
    if stored is not None:
        return dict(stored)
    fully_parallel = getattr(common.get("args"), "ckpt_fully_parallel_save", True)
    return {"distrib_optim_sharding_type": "fully_sharded_model_space" if fully_parallel else "dp_zero_gather_scatter"}


def check_optimizer_readable(ckpt_dir, metadata: dict) -> None:
    """Raise (naming the layout and --no-load-optim) when the checkpoint's optimizer layout is one
    this megatron-core cannot read, instead of megatron's exception from deep inside the load."""
    import megatron.core

    layout = metadata.get("distrib_optim_sharding_type")
    if layout in UNREADABLE_OPTIMIZER_LAYOUTS:
        raise ValueError(
            f"{ckpt_dir} holds the distributed optimizer in the {layout} layout (Megatron-LM before 0.14, "
            f"no content_metadata), which megatron-core {megatron.core.__version__} cannot read: resume "
            "with --no-load-optim (weights and RNG states; a fresh optimizer and LR schedule)")


def _sharded_state(state, metadata: dict, *, with_optim: bool, with_rng: bool, loading: bool) -> dict:
    model_sd = unwrap(state.model[0]).sharded_state_dict(metadata=dict(metadata))
    out = {"model": model_sd}
    if with_optim:
        if loading:
            _materialize_distributed_optimizer_state(state.optimizer)
        out["optimizer"] = state.optimizer.sharded_state_dict(model_sd, is_loading=loading, metadata=dict(metadata))
    if with_rng:
        out["rng_state"] = sharded_rng_state(loading)
    return out


@torch.no_grad()
def _materialize_distributed_optimizer_state(optimizer) -> None:
    """Give a fresh DistributedOptimizer's torch optimizer its state before a load, only where
    megatron-core does not: without Apex/TE (torch's Adam, the CPU path) its
    `DistributedOptimizer.state_dict()` (called by `sharded_state_dict(is_loading=True)`)
    asserts every parameter has a `step`. One zero-gradient step creates it; all it touches
    (parameters, moments, step) is then overwritten by the load. With TE or Apex (GPU) megatron
    covers a fresh optimizer itself (the step is read from the param groups and
    `load_state_dict` allocates the state; `HybridDeviceOptimizer.dummy_step` for CPU offload),
    and a `.grad` step would be wrong there: TE's FusedAdam with the precision-aware optimizer
    reads `decoupled_grad`."""
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not isinstance(inner, distrib_optimizer.DistributedOptimizer) or len(inner.optimizer.state) > 0:
            continue
        params = [p for group in inner.optimizer.param_groups for p in group["params"] if p.numel() > 0]
        for param in params:
            param.grad = torch.zeros_like(param)
        inner.optimizer.step()
        for param in params:
            param.grad = None


def _unshare_adam_steps(optimizer) -> None:
    """Give every parameter its own torch-Adam `step` tensor after a load: without Apex/TE,
    megatron-core 0.16's `DistributedOptimizer.load_state_dict` shares one `step` tensor across
    parameters, which torch's Adam increments in place once per parameter (seen: 1 -> 17)."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_opt = getattr(inner, "optimizer", None)
        for param_state in getattr(torch_opt, "state", {}).values():
            if torch.is_tensor(param_state.get("step")):
                param_state["step"] = param_state["step"].clone()


# ----- save ------------------------------------------------------------------------------------
def save_checkpoint(save_dir, iteration: int, state, *, rollout_id: int, args, save_optim: bool = True,
                    extra: dict | None = None, background: bool = False):
    """Write `state` (every rank calls) to `{save_dir}/iter_{iteration:07d}`, then the tracker file.

    `state` is a `TrainState`; `extra` adds common (unsharded) entries. Returns the iteration
    folder, or with `background` (`--async-save`) a `torch_dist.PendingSave`: the tensors are
    copied now, written by a thread, and its `finalize()` (every rank) writes the tracker.
    """
    sharded = _sharded_state(state, CONTENT_METADATA, with_optim=save_optim, with_rng=True, loading=False)
    sharded.update({
        "opt_param_scheduler": state.scheduler.state_dict(),
        "iteration": iteration,
        "rollout_id": rollout_id,
        "checkpoint_version": CHECKPOINT_VERSION,
        "content_metadata": dict(CONTENT_METADATA),
        "args": plain_args(args, world_size=dist.get_world_size()),
        **(extra or {}),
    })
    out = write_torch_dist(sharded, save_dir, iteration, background=background)
    logger.info("%s checkpoint %s (rollout %d, optimizer %s)", "writing" if background else "saved",
                iteration_dir(save_dir, iteration), rollout_id, save_optim)
    return out


# ----- load ------------------------------------------------------------------------------------
def _same_layout(saved_args) -> bool:
    """Whether (pp, tp, ep) sizes and the world size equal the saved ones."""
    from megatron.core import parallel_state as mpu

    shape = (mpu.get_pipeline_model_parallel_world_size(), mpu.get_tensor_model_parallel_world_size(),
             mpu.get_expert_model_parallel_world_size())
    saved = tuple(getattr(saved_args, k, None) or 1 for k in (
        "pipeline_model_parallel_size", "tensor_model_parallel_size", "expert_model_parallel_size"))
    saved_world = getattr(saved_args, "world_size", None)
    return saved == shape and saved_world == dist.get_world_size()


def _load_model_state(model, state_dict: dict, where, strict: bool) -> None:
    missing, unexpected = unwrap(model).load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if strict and (missing or unexpected):
        raise RuntimeError(f"{where}: missing keys {missing}, unexpected keys {unexpected}")


def _rng_loadable(ckpt_dir, saved: dict, saved_args) -> bool:
    """Whether the checkpoint's RNG states can be restored here: the same (pp, tp, ep) sizes and
    world size, and Megatron-LM's `rng_state` layout (one object per (pp, tp)); logged when not."""
    if not _same_layout(saved_args):
        logger.warning("%s was saved with another parallel layout: RNG states not restored", ckpt_dir)
        return False
    if sharded_rng_state(loading=True).unique_key not in saved:  # e.g. saved per global rank
        logger.warning("%s holds no rng_state per (pp, tp) (Megatron-LM's layout): RNG states not restored", ckpt_dir)
        return False
    return True


def load_checkpoint(load_dir, state, *, load_optim: bool = True, load_rng: bool = True,
                    strict: bool = True) -> tuple[int, dict] | None:
    """Load the tracker's iteration of `load_dir` into `state` (any saved layout for the model).

    Returns `(iteration, common)` where `common` holds `args` (and `rollout_id` for our own
    checkpoints), or None when `load_dir` has no tracker file. The optimizer state is requested
    in the layout the checkpoint was saved with (`checkpoint_metadata`) and needs the optimizer
    keys in it (`--no-save-optim` checkpoints need `--no-load-optim`). RNG states are restored
    only when `_rng_loadable` (else logged and skipped). A `release` checkpoint (slime's and
    Megatron-LM's converter output) loads as in Megatron-LM: weights only (no optimizer, schedule
    or RNG), iteration 0.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    iteration = read_tracker(load_dir)
    if iteration is None:
        return None
    ckpt_dir = iteration_dir(load_dir, iteration)
    common = dist_checkpointing.load_common_state_dict(str(ckpt_dir))
    if iteration == RELEASE:
        iteration, load_optim, load_rng = 0, False, False
    saved = load_sharded_metadata(str(ckpt_dir))
    load_rng = load_rng and _rng_loadable(ckpt_dir, saved, common.get("args"))
    if load_optim and not any(key.startswith(("optimizer.", "chained_")) for key in saved):
        raise ValueError(f"{ckpt_dir} has no optimizer state (saved with --no-save-optim): pass --no-load-optim")
    metadata = checkpoint_metadata(common)
    if load_optim:
        check_optimizer_readable(ckpt_dir, metadata)
    sharded = _sharded_state(state, metadata, with_optim=load_optim, with_rng=load_rng, loading=True)
    loaded = dist_checkpointing.load(sharded, str(ckpt_dir), strict="assume_ok_unexpected")
    _load_model_state(state.model[0], loaded["model"], ckpt_dir, strict)
    if load_optim:
        with torch.no_grad():  # fp32 distributed-optimizer shards are views of parameters
            state.optimizer.load_state_dict(loaded["optimizer"])
        _unshare_adam_steps(state.optimizer)
        state.scheduler.load_state_dict(common["opt_param_scheduler"])
    else:
        state.optimizer.reload_model_params()
    if load_rng:
        set_rng_state(own_rng_state(loaded["rng_state"]))
    logger.info("loaded checkpoint %s (optimizer %s, rng %s)", ckpt_dir, load_optim, load_rng)
    return iteration, common


def load_model_weights(load_dir, model, flag: str = "--ref-load") -> int | str:
    """Weights only from the tracker's iteration of `load_dir` into `model` (DDP, Float16Module
    or bare GPTModel; any saved layout). Returns the iteration (or `release`); raises naming
    `flag`, the folder and what is missing when it holds no complete checkpoint."""
    require_checkpoint(flag, load_dir)
    iteration = read_tracker(load_dir)
    load_torch_dist(unwrap(model), iteration_dir(load_dir, iteration))
    return iteration


def require_checkpoint(flag: str, path) -> None:
    """Raise ArgumentError (one line: the flag, the folder, what is missing) unless `path` holds
    a complete checkpoint (`checkpoint_layout.load_problem`)."""
    problem = load_problem(flag, path)
    if problem is not None:
        raise ArgumentError(problem)


def resumes(flag: str, path, save) -> bool:
    """Whether `flag path` is a checkpoint to resume: False when not given or on slime's first
    launch (`path` is the `save` folder and holds no checkpoint yet: the run starts fresh, as the
    start-up check warned); raises ArgumentError for any other folder without a complete checkpoint."""
    if path is None:
        return False
    if first_launch(path, save):
        logger.info("%s %s holds no checkpoint yet (first launch): starting fresh", flag, path)
        return False
    require_checkpoint(flag, path)
    return True


# ----- start of a run, HF export ---------------------------------------------------------------
def load_initial_state(args, state, ref_model=None) -> tuple[int, dict]:
    """Where a run starts (Megatron-LM's rule): resume from `--load` (model, optimizer unless
    --no-load-optim, schedule, RNG unless --no-load-rng; `--finetune` or a `release` checkpoint:
    weights only, counts restart), else weights from `--ref-load`; the reference model gets
    `--ref-load`'s weights. `--load` is never silently ignored (`resumes`): only slime's first
    launch (`--load` = `--save`, no checkpoint yet) starts without it. Checks `--save-hf` first.
    Returns (start rollout id, common state of the resumed checkpoint or {}); sets
    `args.start_rollout_id` unless the user gave one. The resumed rollout is the checkpoint's
    `rollout_id` (ours), else its iteration (slime saves iteration = rollout id)."""
    if args.save_hf:
        check_save_hf(args)
    if ref_model is not None and args.ref_load:
        load_model_weights(args.ref_load, ref_model)
    resumed = None
    if resumes("--load", args.load, args.save):
        weights_only = args.finetune or read_tracker(args.load) == RELEASE
        resumed = load_checkpoint(args.load, state, load_optim=not (args.no_load_optim or weights_only),
                                  load_rng=not (args.no_load_rng or weights_only))
        if weights_only:
            resumed = None, {}
    elif args.ref_load:
        load_model_weights(args.ref_load, state.model[0])
        state.optimizer.reload_model_params()
    iteration, common = resumed if resumed is not None else (None, {})
    start = int(common.get("rollout_id", iteration)) + 1 if common else 0
    if args.start_rollout_id is None:
        args.start_rollout_id = start
    return start, common


def check_save_hf(args) -> None:
    """Raise (at start-up) when `--save-hf` cannot be served: pipeline stages, or no --hf-checkpoint."""
    from megatron.core import parallel_state as mpu

    if mpu.get_pipeline_model_parallel_world_size() > 1:
        raise ValueError("--save-hf needs --pipeline-model-parallel-size 1 (one rank must hold every layer); "
                         "convert a pipelined checkpoint with tools/convert_torch_dist_to_hf.py instead")
    if not args.hf_checkpoint:
        raise ValueError("--save-hf needs --hf-checkpoint (the HF config and tokenizer to copy)")


def save_hf(args, model, rollout_id: int) -> Path:
    """Write HF safetensors of `model` to `args.save_hf.format(rollout_id=...)` (collective; config
    and tokenizer copied from `--hf-checkpoint`). Needs PP = 1."""
    from slime.backends.megatron_utils.weight_export import write_hf_checkpoint

    check_save_hf(args)
    return write_hf_checkpoint(unwrap(model), args, args.hf_checkpoint, args.save_hf.format(rollout_id=rollout_id))
