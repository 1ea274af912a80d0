"""What the run's machine has (CUDA, Transformer Engine, apex's kernels) and what it decides in
megatron-core's configs: the fusions, and whether the precision-aware optimizer can be built.

`Kernels.here()` probes this machine; the dry run builds a GPU recipe's configs with
`Kernels.gpu_run()` on any machine (`config_check.py`).
"""

import argparse
import importlib.util
import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


def kernel_available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@dataclass(frozen=True)
class Kernels:
    """What the run's machine has that decides megatron-core's config values: CUDA, Transformer
    Engine and apex's ``fused_weight_gradient_mlp_cuda`` (the weight-gradient accumulation kernel
    megatron's ``ColumnParallelLinear``, GPTModel's output layer, needs whatever
    ``--transformer-impl``). ``here()`` probes this machine (the run itself); the dry run passes
    ``of_recipe(args)``, for a GPU recipe ``gpu_run()``, the machine ``docs/gpu-guide.md`` sets up,
    so it builds the GPU run's configs on any machine."""

    cuda: bool
    transformer_engine: bool
    apex_grad_accum: bool

    @classmethod
    def here(cls) -> "Kernels":
        return cls(cuda=torch.cuda.is_available(), transformer_engine=kernel_available("transformer_engine"),
                   apex_grad_accum=kernel_available("fused_weight_gradient_mlp_cuda"))

    @classmethod
    def gpu_run(cls, apex_grad_accum: bool = True) -> "Kernels":
        return cls(cuda=True, transformer_engine=True, apex_grad_accum=apex_grad_accum)

    @classmethod
    def of_recipe(cls, args: argparse.Namespace) -> "Kernels":
        """The machine a recipe is written for, whatever machine reads it: a CPU one (no CUDA, no
        kernels) with ``--distributed-backend gloo`` (the CPU recipes), else `gpu_run`."""
        if getattr(args, "distributed_backend", "nccl") == "gloo":
            return cls(cuda=False, transformer_engine=False, apex_grad_accum=False)
        return cls.gpu_run()


# TransformerConfig fusion field -> (args dest, the flag that turns it off)
FUSION_FLAGS = {
    "masked_softmax_fusion": ("masked_softmax_fusion", "--no-masked-softmax-fusion"),
    "bias_activation_fusion": ("bias_swiglu_fusion", "--no-bias-swiglu-fusion"),
    "apply_rope_fusion": ("apply_rope_fusion", "--no-rope-fusion"),
    "gradient_accumulation_fusion": ("gradient_accumulation_fusion", "--no-gradient-accumulation-fusion"),
}


def fusion_fields(args: argparse.Namespace, kernels: Kernels | None = None) -> dict:
    """Megatron-LM's fusions: on by default on GPU, each turned off by its ``--no-*-fusion`` flag
    (Megatron-LM's mapping: ``--no-bias-swiglu-fusion`` -> ``bias_activation_fusion`` with
    ``--swiglu``). Without CUDA every fusion is off (their kernels are CUDA kernels). A fusion whose
    kernel is missing on GPU is turned off with a warning naming the flag that silences it, as
    Megatron-LM does: rope needs Transformer Engine; weight-gradient accumulation needs apex's
    ``fused_weight_gradient_mlp_cuda`` even with Transformer Engine (megatron's
    ``ColumnParallelLinear`` output layer raises at construction without it)."""
    kernels = kernels or Kernels.here()
    if not kernels.cuda:
        return dict.fromkeys(FUSION_FLAGS, False)
    wanted = {name: getattr(args, dest, True) for name, (dest, _) in FUSION_FLAGS.items()}
    wanted["bias_activation_fusion"] = wanted["bias_activation_fusion"] and bool(getattr(args, "swiglu", False))
    wanted["apply_rope_fusion"] = (wanted["apply_rope_fusion"]
                                   and getattr(args, "position_embedding_type", "rope") == "rope")
    available = {"apply_rope_fusion": (kernels.transformer_engine, "Transformer Engine"),
                 "gradient_accumulation_fusion": (kernels.apex_grad_accum, "apex's fused_weight_gradient_mlp_cuda")}
    out = {}
    for name, on in wanted.items():
        present, package = available.get(name, (True, ""))
        out[name] = bool(on and present)
        if on and not present:
            logger.warning("%s: %s is not installed; turned off (pass %s to silence this)",
                           name, package, FUSION_FLAGS[name][1])
    return out


def check_precision_aware_optimizer(kwargs: dict, kernels: Kernels) -> None:
    """Refuse --use-precision-aware-optimizer where megatron-core 0.16.1 cannot build it on the run's
    machine `kernels`: without --optimizer-cpu-offload it steps TE's FusedAdam; with it,
    HybridDeviceOptimizer steps torch's CPU AdamW and megatron only reads TE's version, which the
    patch `optimizer_te_version` answers wherever TE is absent, GPU machines included (`te_absent`)."""
    if not kwargs["use_precision_aware_optimizer"] or kernels.transformer_engine:
        return
    if not kwargs["optimizer_cpu_offload"]:
        raise ImportError(
            "--use-precision-aware-optimizer without --optimizer-cpu-offload needs Transformer Engine "
            "(megatron-core steps TE's FusedAdam); install transformer_engine or drop the flag")
