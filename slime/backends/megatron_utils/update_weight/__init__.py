"""Trainer -> engine weight sync: the senders and how a trainer picks and builds one.

Owns the registry `SENDERS` (kind -> sender class: "distributed" broadcast group for
disaggregated engines, "tensor" shared memory for colocated ones, "disk" HF folder),
`sender_kind(args)` (--colocate -> "tensor", else "distributed") and `build_weight_sender`, which
wires a sender to a megatron model: buckets from `weight_export.iter_hf_buckets` of
--update-weight-buffer-size bytes (quantised to block FP8 when --hf-checkpoint declares
`quant_method: fp8`, see `slime.utils.fp8`), roles from megatron's parallel state.
"""

from __future__ import annotations

import os
import tempfile

from slime.backends.megatron_utils.update_weight.common import TrainerRole, WeightSender, megatron_role
from slime.backends.megatron_utils.update_weight.from_disk import UpdateWeightFromDisk
from slime.backends.megatron_utils.update_weight.from_distributed import UpdateWeightFromDistributed
from slime.backends.megatron_utils.update_weight.from_tensor import UpdateWeightFromTensor

SENDERS = {
    "distributed": UpdateWeightFromDistributed,
    "tensor": UpdateWeightFromTensor,
    "disk": UpdateWeightFromDisk,
}


def sender_kind(args) -> str:
    """"tensor" when the engines share the trainer's devices (--colocate), else "distributed".

    The tensor path hands over safetensors files in /dev/shm, which our local engine reads.
    SGLang's colocated path expects CUDA-IPC handles in its own serialisation, which is not
    implemented: colocated SGLang engines are refused here with what to do instead."""
    if not args.colocate:
        return "distributed"
    import torch

    if torch.cuda.is_available() and args.rollout_engine != "local":
        raise NotImplementedError(
            "--colocate with SGLang engines needs CUDA-IPC weight sync in SGLang's tensor format, "
            "which this build does not have yet: drop --colocate (disaggregated engines get weights "
            "by NCCL broadcast) or use --rollout-engine local"
        )
    return "tensor"


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
    from slime.utils.fp8 import fp8_config_from_hf, quantized_buckets

    kind = kind or sender_kind(args)
    if kind not in SENDERS:
        raise ValueError(f"unknown weight sync kind {kind!r}; choose one of {sorted(SENDERS)}")
    hf_config = read_hf_config(args.hf_checkpoint)
    to_cpu = kind != "distributed" or not torch.cuda.is_available()

    def buckets():
        return iter_hf_buckets(model, hf_config, args, args.update_weight_buffer_size, to_cpu=to_cpu)

    role = megatron_role()
    fp8 = fp8_config_from_hf(hf_config)
    if fp8 is not None and role.is_sender:  # an FP8 engine checkpoint: send its names, dtypes, shapes
        buckets = quantized_buckets(buckets, fp8)

    extra = {}
    if kind == "disk":
        extra = {"directory": disk_dir or os.path.join(tempfile.gettempdir(), "slime_weight_sync"),
                 "hf_checkpoint": args.hf_checkpoint}
    sender = SENDERS[kind](engine_urls, buckets, role=role, **extra)
    sender.connect()
    return sender


__all__ = ["SENDERS", "TrainerRole", "UpdateWeightFromDisk", "UpdateWeightFromDistributed",
           "UpdateWeightFromTensor", "WeightSender", "build_weight_sender", "megatron_role", "sender_kind"]
