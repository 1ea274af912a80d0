"""Trainer GPU memory and CPU-Adam host RAM for the ``--dry-run`` plan.

Owns the per-GPU budget of one trainer rank on its worst pipeline stage: weights, gradient
buffer, optimizer states (sharded by the distributed optimizer, on GPU or CPU), activations,
logits, a fixed reserve and allocator fragmentation; and the host RAM per node that CPU Adam
needs. Formulas and assumptions are written out in ``docs/dry-run-plan.md``.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass, field

from slime.utils.plan.activations import logits_bytes, stage_activations
from slime.utils.plan.layout import ParallelLayout, stage_layer_ranges
from slime.utils.plan.model import ModelShape, ParamSplit, embedding_params, layer_params, output_params

GIB = 1024**3

# Bytes per element of the dtype names Megatron's precision flags take (before or after its
# conversion to torch dtypes).
DTYPE_BYTES = {
    "fp32": 4, "float32": 4, "torch.float32": 4,
    "bf16": 2, "bfloat16": 2, "torch.bfloat16": 2,
    "fp16": 2, "float16": 2, "torch.float16": 2,
    "fp8": 1, "uint8": 1, "torch.uint8": 1,
}

# Fixed per-GPU memory outside PyTorch tensors (GiB): the trainer's CUDA context with cuBLAS /
# cuDNN workspaces, and NCCL communicators of its TP/DP/EP/PP groups with their buffers.
RESERVE_GIB = {"cuda context + workspaces": 1.0, "NCCL communicators": 1.5}
# Colocated only: the sleeping SGLang engine on the same GPU keeps its CUDA context, NCCL
# buffers and non-releasable allocations after /release_memory_occupation.
COLOCATED_ENGINE_RESIDUE_GIB = 2.0
# PyTorch caching-allocator fragmentation, as a fraction of tensor bytes on the GPU. MoE token
# dispatch and dynamic batches make block sizes vary from step to step.
FRAGMENTATION = 0.15


def dtype_bytes(value, default: int = 4) -> int:
    """Bytes of a precision-flag dtype (None -> ``default``); ValueError for an unknown name."""
    if value is None:
        return default
    key = str(value)
    if key not in DTYPE_BYTES:
        raise ValueError(f"--dry-run plan: unknown dtype {key!r} in a precision flag; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each training-state tensor."""

    weight: int
    grad: int
    master: int  # fp32 copy kept by the optimizer (0 when training in fp32)
    exp_avg: int
    exp_avg_sq: int

    @property
    def optimizer(self) -> int:
        """Optimizer-state bytes per parameter (master + both moments)."""
        return self.master + self.exp_avg + self.exp_avg_sq


def precision_from_args(args: Namespace) -> Precision:
    """Resolve weight/grad/optimizer bytes from --bf16/--fp16, --accumulate-allreduce-grads-in-fp32
    and, with --use-precision-aware-optimizer, --main-params/--exp-avg/--exp-avg-sq/--main-grads-dtype."""
    half = bool(getattr(args, "bf16", False) or getattr(args, "fp16", False))
    weight = 2 if half else 4
    grad = 4 if (not half or getattr(args, "accumulate_allreduce_grads_in_fp32", False)) else 2
    if getattr(args, "use_precision_aware_optimizer", False):
        grad = max(grad, dtype_bytes(getattr(args, "main_grads_dtype", None)) if half else 4)
        master = dtype_bytes(getattr(args, "main_params_dtype", None)) if half else 0
        return Precision(weight, grad, master, dtype_bytes(getattr(args, "exp_avg_dtype", None)),
                         dtype_bytes(getattr(args, "exp_avg_sq_dtype", None)))
    return Precision(weight, grad, 4 if half else 0, 4, 4)


def stage_params(s: ModelShape, lay: ParallelLayout, stage: int) -> ParamSplit:
    """Whole-model parameters living on pipeline stage ``stage`` (embedding on the first, final
    norm and output layer on the last; a tied embedding is also copied to the last when PP > 1)."""
    layers = stage_layer_ranges(s.num_layers, lay.pp)[stage]
    split = ParamSplit()
    for i in layers:
        split = split + layer_params(s, i)
    if stage == 0:
        split = split + embedding_params(s)
    if stage == lay.pp - 1:
        split = split + output_params(s)
        if not s.untied and lay.pp > 1:
            split = split + embedding_params(s)
    return split


@dataclass
class TrainerMemory:
    """GiB-ready byte counts for one trainer GPU on the worst pipeline stage."""

    stage: int
    dense_params: int  # per GPU
    expert_params: int  # per GPU
    owned_params: int  # optimizer shard owned by this rank
    optimizer_sharding: str
    parts: dict[str, int] = field(default_factory=dict)  # name -> bytes on GPU
    optimizer_on_cpu: int = 0
    tokens: int = 0
    budget: int = 0

    @property
    def total(self) -> int:
        """Bytes on the GPU, every part summed."""
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        """True when the total is within --gpu-memory-gib."""
        return self.total <= self.budget


def _owned(dense: float, expert: float, lay: ParallelLayout, distributed: bool) -> tuple[float, str]:
    if not distributed:
        return dense + expert, "not sharded (no distributed optimizer)"
    how = f"dense over DP*CP={lay.dp * lay.cp}, experts over expert-DP={lay.expert_dp}"
    return dense / (lay.dp * lay.cp) + expert / lay.expert_dp, how


def _stage_memory(args, s, lay, prec, stage, act_cfg) -> TrainerMemory:
    split = stage_params(s, lay, stage)
    dense = split.tp / lay.tp + split.replicated
    expert = split.expert / (lay.ep * lay.etp)
    offload = bool(getattr(args, "optimizer_cpu_offload", False))
    distributed = offload or bool(getattr(args, "use_distributed_optimizer", False))
    owned, how = _owned(dense, expert, lay, distributed)
    cpu_fraction = float(getattr(args, "optimizer_offload_fraction", 1.0) or 0.0) if offload else 0.0
    opt = owned * prec.optimizer
    tokens, seq_len, recompute, flash = act_cfg
    in_flight = lay.pp - stage  # 1F1B: stage s holds PP - s micro-batches before its first backward
    layers = stage_layer_ranges(s.num_layers, lay.pp)[stage]
    parts = {
        "weights": int((dense + expert) * prec.weight),
        "gradient buffer": int((dense + expert) * prec.grad),
        "optimizer states": int(opt * (1 - cpu_fraction)),
        "activations": in_flight * stage_activations(s, lay, layers, tokens, seq_len, recompute, flash),
        "logits": logits_bytes(s, lay, tokens) if stage == lay.pp - 1 else 0,
    }
    parts["allocator fragmentation"] = int(FRAGMENTATION * sum(parts.values()))
    reserve = sum(RESERVE_GIB.values()) + (COLOCATED_ENGINE_RESIDUE_GIB if args.colocate else 0.0)
    parts["fixed reserve"] = int(reserve * GIB)
    return TrainerMemory(stage, int(dense), int(expert), int(owned), how, parts,
                         int(opt * cpu_fraction), tokens, int(args.gpu_memory_gib * GIB))


def _activation_config(args: Namespace, lay: ParallelLayout):
    prompt = getattr(args, "rollout_max_prompt_len", None) or 0
    seq_len = getattr(args, "rollout_max_context_len", None) or prompt + (args.rollout_max_response_len or 0)
    if getattr(args, "use_dynamic_batch_size", False) and args.max_tokens_per_gpu:
        tokens = args.max_tokens_per_gpu
    else:
        tokens = (args.micro_batch_size or 1) * seq_len // lay.cp
    recompute = {"granularity": getattr(args, "recompute_granularity", None),
                 "method": getattr(args, "recompute_method", None) or "uniform",
                 "num_layers": getattr(args, "recompute_num_layers", None)}
    backend = str(getattr(args, "attention_backend", "flash") or "flash").lower()
    flash = not any(name in backend for name in ("unfused", "local"))
    return tokens, min(seq_len, tokens) if seq_len else tokens, recompute, flash


def stage_memories(args: Namespace, s: ModelShape, lay: ParallelLayout) -> list[TrainerMemory]:
    """Memory of one trainer GPU on each pipeline stage, stage 0 first."""
    prec = precision_from_args(args)
    act_cfg = _activation_config(args, lay)
    return [_stage_memory(args, s, lay, prec, stage, act_cfg) for stage in range(lay.pp)]


def trainer_memory(args: Namespace, s: ModelShape, lay: ParallelLayout) -> TrainerMemory:
    """Memory of one trainer GPU on the pipeline stage that needs the most."""
    return max(stage_memories(args, s, lay), key=lambda m: m.total)


@dataclass
class HostMemory:
    """CPU-Adam host RAM: bytes per trainer rank, ranks per node, bytes per node, budget."""

    per_rank: int
    ranks_per_node: int
    bytes_per_param: int
    budget: int | None

    @property
    def per_node(self) -> int:
        """Host bytes of all trainer ranks of one node."""
        return self.per_rank * self.ranks_per_node

    @property
    def fits(self) -> bool | None:
        """None without --host-memory-gib, else whether a node's RAM holds it."""
        return None if self.budget is None else self.per_node <= self.budget


def host_memory(args: Namespace, gpu: TrainerMemory) -> HostMemory | None:
    """Host RAM for --optimizer-cpu-offload (None without it): per parameter a rank owns, an fp32
    master copy, the two Adam moments (--exp-avg-dtype / --exp-avg-sq-dtype) and an fp32 grad copy."""
    if not getattr(args, "optimizer_cpu_offload", False):
        return None
    aware = getattr(args, "use_precision_aware_optimizer", False)
    moments = (dtype_bytes(getattr(args, "exp_avg_dtype", None)) + dtype_bytes(getattr(args, "exp_avg_sq_dtype", None))
               if aware else 8)
    per_param = 4 + moments + 4
    fraction = float(getattr(args, "optimizer_offload_fraction", 1.0) or 0.0)
    budget = getattr(args, "host_memory_gib", None)
    return HostMemory(int(gpu.owned_params * fraction * per_param), args.actor_num_gpus_per_node, per_param,
                      None if budget is None else int(budget * GIB))
