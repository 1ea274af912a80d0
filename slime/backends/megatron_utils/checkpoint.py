"""Trainer checkpoints: save, resume and weights-only loads in Megatron-LM's torch_dist layout.

Owns `save_checkpoint` / `load_checkpoint` (model, optimizer, LR schedule, RNG states and the
counters of one `TrainState`), `load_model_weights` (weights only: `--ref-load`, the reference
model) and the HF export of `--save-hf`.

Layout (Megatron-LM's): `{save}/iter_{iteration:07d}/` holds the dist_checkpointing files and
`{save}/latest_checkpointed_iteration.txt` the iteration, written by rank 0 after every rank
finished. The state dict keys are Megatron-LM's: `model`, `optimizer`, `opt_param_scheduler`,
`rng_state` (a ShardedObject per global rank, see `sharded_rng_state`), `iteration`,
`checkpoint_version` (3.0), `args`; slime adds `rollout_id` (and the trainer `step_id`). `args` is
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

from slime.backends.megatron_utils.torch_dist import (
    CHECKPOINT_VERSION,
    TRACKER_FILE,
    iteration_dir,
    load_torch_dist,
    plain_args,
    read_tracker,
    write_torch_dist,
)
from slime.backends.megatron_utils.model import unwrap

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


def sharded_rng_state():
    """ShardedObject `rng_state` holding this rank's states, one object per global rank (shape
    (world,), offset (rank,)). Megatron-LM indexes by (pp, tp[, ep]) with the data-parallel rank
    as replica id; with EP > 1 expert ranks lie inside data parallel and a (pp, tp, ep) position
    can have no replica 0, so slime keys by global rank and restores RNG only at the same layout."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return ShardedObject("rng_state", get_rng_state(), (dist.get_world_size(),), (dist.get_rank(),), replica_id=0)


# Megatron-LM's default sharded-state metadata (`content_metadata`): the distributed optimizer's
# state is saved per data-parallel group (`dp_reshardable`), loadable at the same TP/PP/EP layout.
CONTENT_METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "chained_optim_avoid_prefix": True,
                    "singleton_local_shards": False}


def _sharded_state(state, *, with_optim: bool, with_rng: bool, loading: bool) -> dict:
    model_sd = unwrap(state.model[0]).sharded_state_dict(metadata=dict(CONTENT_METADATA))
    out = {"model": model_sd}
    if with_optim:
        if loading:
            _materialize_distributed_optimizer_state(state.optimizer)
        out["optimizer"] = state.optimizer.sharded_state_dict(model_sd, is_loading=loading,
                                                              metadata=dict(CONTENT_METADATA))
    if with_rng:
        out["rng_state"] = sharded_rng_state()
    return out


@torch.no_grad()
def _materialize_distributed_optimizer_state(optimizer) -> None:
    """Give a fresh DistributedOptimizer's torch optimizer its state before a load: without
    Apex/TE, megatron-core's `DistributedOptimizer.state_dict()` (called by
    `sharded_state_dict(is_loading=True)`) asserts every parameter has a `step`. One zero-gradient
    step creates it; all it touches (parameters, moments, step) is then overwritten by the load."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not isinstance(inner, DistributedOptimizer) or len(inner.optimizer.state) > 0:
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
    sharded = _sharded_state(state, with_optim=save_optim, with_rng=True, loading=False)
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


def load_checkpoint(load_dir, state, *, load_optim: bool = True, load_rng: bool = True,
                    strict: bool = True) -> tuple[int, dict] | None:
    """Load the tracker's iteration of `load_dir` into `state` (any saved layout for the model).

    Returns `(iteration, common)` where `common` holds `rollout_id` and `args`, or None when
    `load_dir` has no tracker file. RNG states are restored only when the parallel layout and
    world size are the saved ones (else logged and skipped); the optimizer needs the optimizer
    keys in the checkpoint (`--no-save-optim` checkpoints need `--no-load-optim`).
    """
    from megatron.core import dist_checkpointing

    iteration = read_tracker(load_dir)
    if iteration is None:
        return None
    ckpt_dir = iteration_dir(load_dir, iteration)
    common = dist_checkpointing.load_common_state_dict(str(ckpt_dir))
    if load_rng and not _same_layout(common.get("args")):
        logger.warning("%s was saved with another parallel layout: RNG states not restored", ckpt_dir)
        load_rng = False
    sharded = _sharded_state(state, with_optim=load_optim, with_rng=load_rng, loading=True)
    saved_keys = dist_checkpointing.load_tensors_metadata(str(ckpt_dir))
    if load_optim and not any(key.startswith(("optimizer.", "chained_")) for key in saved_keys):
        raise ValueError(f"{ckpt_dir} has no optimizer state (saved with --no-save-optim): pass --no-load-optim")
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
        set_rng_state(loaded["rng_state"])
    logger.info("loaded checkpoint %s (optimizer %s, rng %s)", ckpt_dir, load_optim, load_rng)
    return iteration, common


def load_model_weights(load_dir, model) -> int:
    """Weights only from the tracker's iteration of `load_dir` into `model` (DDP, Float16Module
    or bare GPTModel; any saved layout). Returns the iteration; raises when there is no tracker."""
    iteration = read_tracker(load_dir)
    if iteration is None:
        raise FileNotFoundError(f"{Path(load_dir) / TRACKER_FILE} not found: "
                                f"is {load_dir} a Megatron torch_dist checkpoint?")
    load_torch_dist(unwrap(model), iteration_dir(load_dir, iteration))
    return iteration


# ----- start of a run, HF export ---------------------------------------------------------------
def load_initial_state(args, state, ref_model=None) -> tuple[int, dict]:
    """Where a run starts (Megatron-LM's rule): resume from `--load` when it has a tracker file
    (model, optimizer unless --no-load-optim, schedule, RNG unless --no-load-rng; `--finetune`:
    weights only, count restarts), else weights from `--ref-load`; the reference model gets
    `--ref-load`'s weights. Checks `--save-hf` first. Returns (start rollout id, common state of
    the resumed checkpoint or {}); sets `args.start_rollout_id` unless the user gave one."""
    if args.save_hf:
        check_save_hf(args)
    if ref_model is not None and args.ref_load:
        load_model_weights(args.ref_load, ref_model)
    resumed = None
    if args.load and read_tracker(args.load) is not None:
        resumed = load_checkpoint(args.load, state, load_optim=not (args.no_load_optim or args.finetune),
                                  load_rng=not (args.no_load_rng or args.finetune))
    if resumed is None and args.ref_load:
        load_model_weights(args.ref_load, state.model[0])
        state.optimizer.reload_model_params()
    common = resumed[1] if resumed is not None else {}
    start = int(common["rollout_id"]) + 1 if common and not args.finetune else 0
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
