"""Model, optimizer and LR schedule for one trainer rank, built from args.

The actor model is this rank's GPTModel stage wrapped in megatron-core's DistributedDataParallel
(fp32 or bf16 via Float16Module), with megatron-core's optimizer (distributed optimizer, CPU
offload and the precision-aware optimizer come from `optimizer_config_from_args`) and
`OptimizerParamScheduler`. The reference model used for the KL term is the same stage without
gradients, DDP or optimizer; it only receives `--ref-load`'s weights, which then move to the host
(`reference.HostReference`, swapped into the actor for the reference pass).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

import torch

from slime.backends.megatron_utils.config import (
    ddp_config_from_args,
    optimizer_config_from_args,
    transformer_config_from_args,
)
from slime.backends.megatron_utils.model_provider import build_model_for_stage

logger = logging.getLogger(__name__)


@dataclass
class TrainState:
    """What one rank trains: model chunks (one per virtual stage; we use one), optimizer, schedule."""

    model: list
    optimizer: object
    scheduler: object
    config: object


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def build_bare_model(args: argparse.Namespace, config=None, post_build=None):
    """This rank's GPTModel stage on the training device, tensor-parallel attributes set.
    `post_build(model, config)` may change the bare model first (the critic's value head)."""
    from megatron.core import tensor_parallel

    config = config or _train_config(args)
    model = build_model_for_stage(args, config=config)
    if post_build is not None:
        post_build(model, config)
    for param in model.parameters():
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    model.to(_device())
    if config.bf16 or config.fp16:
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(config, model)
    return model


def _train_config(args: argparse.Namespace):
    return transformer_config_from_args(args)


def build_train_state(args: argparse.Namespace, post_build=None) -> TrainState:
    """Model wrapped in DDP, its optimizer and LR scheduler (not yet loaded from a checkpoint);
    `post_build` as in `build_bare_model`."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import get_megatron_optimizer

    config = _train_config(args)
    model = DistributedDataParallel(config=config, ddp_config=ddp_config_from_args(args),
                                    module=build_bare_model(args, config, post_build))
    optimizer = get_megatron_optimizer(optimizer_config_from_args(args), [model])
    _wire_schedule_hooks(config, model, optimizer)
    return TrainState(model=[model], optimizer=optimizer, scheduler=build_scheduler(args, optimizer), config=config)


def _wire_schedule_hooks(config, model, optimizer) -> None:
    """What Megatron-LM's training loop sets on the config: the pipeline schedule calls these to
    all-reduce gradients across data parallel (and embedding/layer-norm groups) after the last
    micro-batch, and to scale the loss for fp16."""
    from megatron.core.distributed import finalize_model_grads

    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    if model.ddp_config.overlap_grad_reduce:
        config.no_sync_func = model.no_sync
        config.grad_sync_func = model.start_grad_sync


def build_scheduler(args: argparse.Namespace, optimizer):
    """megatron-core's LR/weight-decay schedule; steps are optimizer steps (not samples)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    total = args.train_iters or _total_train_steps(args)
    warmup = args.lr_warmup_iters or int((args.lr_warmup_fraction or 0.0) * total)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=getattr(args, "lr_warmup_init", 0.0) or 0.0,
        max_lr=args.lr,
        min_lr=args.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=args.lr_decay_iters or total,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.weight_decay,
        end_wd=args.weight_decay,
        wd_incr_steps=total,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=args.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=args.override_opt_param_scheduler,
    )


def _total_train_steps(args: argparse.Namespace) -> int:
    steps_per_rollout = args.num_steps_per_rollout or max(
        1, args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
    )
    return max(1, (args.num_rollout or 1) * steps_per_rollout)


def build_reference_model(args: argparse.Namespace):
    """A frozen copy of the stage for reference log-probs (weights loaded by the caller)."""
    model = build_bare_model(args)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def unwrap(model):
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model
