"""Trainer -> engine weight sync: the senders and how a trainer picks and builds one.

Owns the registry `SENDERS` (kind -> sender class: "distributed" broadcast group for
disaggregated engines, "tensor" SGLang's tensor payload (CUDA IPC handles / shared memory) for
colocated ones, "disk" HF folder),
`sender_kind(args)` (--colocate -> "tensor", else "distributed") and `build_weight_sender`, which
wires a sender to a megatron model: buckets from `weight_export.iter_hf_buckets` of
--update-weight-buffer-size bytes (quantised to block FP8 when --hf-checkpoint declares
`quant_method: fp8`, with UE8M0 scales where SGLang requantises to them, see `slime.utils.fp8`), roles from megatron's parallel state.
"""

from __future__ import annotations

import os
import tempfile

from slime.backends.megatron_utils.update_weight.common import TrainerRole, WeightSender, megatron_role
from slime.backends.megatron_utils.update_weight.from_disk import UpdateWeightFromDisk
from slime.backends.megatron_utils.update_weight.from_distributed import UpdateWeightFromDistributed
from slime.backends.megatron_utils.update_weight.from_tensor import UpdateWeightFromTensor, engine_rank_groups

SENDERS = {
    "distributed": UpdateWeightFromDistributed,
    "tensor": UpdateWeightFromTensor,
    "disk": UpdateWeightFromDisk,
}


def sender_kind(args) -> str:
    """"tensor" when the engines share the trainer's devices (--colocate), else "distributed".

    The tensor path speaks SGLang's own /update_weights_from_tensor format (a flattened bucket per
    engine TP rank, see `from_tensor`), which SGLang engines and our local engine both read."""
    return "tensor" if args.colocate else "distributed"


def build_weight_sender(args, model, engine_urls: list[str], kind: str | None = None,
                        disk_dir: str | None = None) -> WeightSender:
    """A connected sender of `kind` (default `sender_kind(args)`) for megatron `model` (unwrapped).

    Collective (every trainer rank calls it). `args` needs --hf-checkpoint,
    --update-weight-buffer-size and the megatron sizes; "disk" writes to `disk_dir` (default
    `<tmp>/slime_weight_sync`, which the engines must be able to read).
    """
    import torch

    from slime.backends.megatron_utils.hf_io import read_hf_config
    from slime.backends.megatron_utils.weight_export import iter_hf_buckets
    import dataclasses

    from slime.utils.fp8 import engine_wants_ue8m0, fp8_config_from_hf, quantized_buckets

    kind = kind or sender_kind(args)
    if kind not in SENDERS:
        raise ValueError(f"unknown weight sync kind {kind!r}; choose one of {sorted(SENDERS)}")
    hf_config = read_hf_config(args.hf_checkpoint)
    to_cpu = kind == "disk" or not torch.cuda.is_available()  # "tensor" shares CUDA tensors by IPC handle

    def buckets():
        return iter_hf_buckets(model, hf_config, args, args.update_weight_buffer_size, to_cpu=to_cpu)

    if kind == "tensor" and getattr(args, "pipeline_model_parallel_size", 1) > 1:
        buckets = _every_stage(buckets)  # an engine's devices hold several stages: each needs them all
    role = megatron_role()
    fp8 = fp8_config_from_hf(hf_config)
    if fp8 is not None and not fp8.ue8m0 and engine_wants_ue8m0(fp8):  # SGLang requantises to UE8M0 there
        fp8 = dataclasses.replace(fp8, ue8m0=True)
    sends = role.is_sender or kind == "tensor"  # the tensor sender ships every rank's bucket
    if fp8 is not None and sends:  # an FP8 engine checkpoint: send its names, dtypes, shapes
        buckets = quantized_buckets(buckets, fp8)

    extra = {}
    if kind == "tensor":
        extra = {"gpus_per_engine": args.rollout_num_gpus_per_engine}
    if kind == "disk":
        extra = {"directory": disk_dir or os.path.join(tempfile.gettempdir(), "slime_weight_sync"),
                 "hf_checkpoint": args.hf_checkpoint, "post_write": _post_write_hook(args)}
    sender = SENDERS[kind](engine_urls, buckets, role=role, **extra)
    sender.connect()
    return sender


def _every_stage(stage_buckets):
    """`stage_buckets` widened to every pipeline stage's buckets on every rank (`pipeline`)."""
    import torch
    import torch.distributed as dist

    from slime.backends.megatron_utils.parallel import megatron_parallel_state
    from slime.backends.megatron_utils.update_weight.pipeline import all_stage_buckets

    mpu = megatron_parallel_state()
    group = mpu.get_pipeline_model_parallel_group()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    ranks = dist.get_process_group_ranks(group)
    return lambda: all_stage_buckets(stage_buckets, mpu.get_pipeline_model_parallel_rank(), ranks, group, device)


def _post_write_hook(args):
    """`--custom-update-weight-post-write-path` bound to `args`: hook(args, version_dir, engine_urls)."""
    path = getattr(args, "custom_update_weight_post_write_path", None)
    if not path:
        return None
    from functools import partial

    from slime.utils.misc import load_function
    from slime.utils.plugins import call_update_weight_post_write

    return partial(call_update_weight_post_write, load_function(path), args)


__all__ = ["SENDERS", "TrainerRole", "UpdateWeightFromDisk", "UpdateWeightFromDistributed",
           "UpdateWeightFromTensor", "WeightSender", "build_weight_sender", "engine_rank_groups", "megatron_role",
           "sender_kind"]
