"""Megatron-core configs built from parsed arguments.

Owns the translation from the Megatron-LM flag vocabulary (``args`` from
``slime.utils.arguments.parse_args``) to megatron-core's typed configs:
``TransformerConfig`` (model shape, MoE, parallelism, recompute),
``OptimizerConfig`` and ``DistributedDataParallelConfig``. Nothing here builds
modules or touches process groups.
"""

import argparse

import torch

from slime.backends.megatron_utils.kernels import (
    FUSION_FLAGS,
    Kernels,
    check_precision_aware_optimizer,
    fusion_fields,
)

# args dest -> TransformerConfig field, copied as is when present on args.
_TRANSFORMER_FIELDS = {
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "ffn_hidden_size",
    "num_attention_heads": "num_attention_heads",
    "kv_channels": "kv_channels",
    "norm_epsilon": "layernorm_epsilon",
    "qk_layernorm": "qk_layernorm",
    "attention_dropout": "attention_dropout",
    "hidden_dropout": "hidden_dropout",
    "init_method_std": "init_method_std",
    "tensor_model_parallel_size": "tensor_model_parallel_size",
    "pipeline_model_parallel_size": "pipeline_model_parallel_size",
    "context_parallel_size": "context_parallel_size",
    "expert_model_parallel_size": "expert_model_parallel_size",
    "sequence_parallel": "sequence_parallel",
    "moe_ffn_hidden_size": "moe_ffn_hidden_size",
    "moe_router_topk": "moe_router_topk",
    "moe_router_score_function": "moe_router_score_function",
    "moe_token_dispatcher_type": "moe_token_dispatcher_type",
    "moe_grouped_gemm": "moe_grouped_gemm",
    "moe_aux_loss_coeff": "moe_aux_loss_coeff",
    "moe_router_pre_softmax": "moe_router_pre_softmax",
    "moe_router_load_balancing_type": "moe_router_load_balancing_type",
    "moe_token_drop_policy": "moe_token_drop_policy",
    "moe_expert_capacity_factor": "moe_expert_capacity_factor",
    "moe_permute_fusion": "moe_permute_fusion",
    "moe_shared_expert_intermediate_size": "moe_shared_expert_intermediate_size",
    "moe_router_topk_scaling_factor": "moe_router_topk_scaling_factor",
    "moe_router_num_groups": "moe_router_num_groups",
    "moe_router_group_topk": "moe_router_group_topk",
    "moe_router_enable_expert_bias": "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate": "moe_router_bias_update_rate",
    "recompute_granularity": "recompute_granularity",
    "recompute_method": "recompute_method",
    "recompute_num_layers": "recompute_num_layers",
    "recompute_modules": "recompute_modules",
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
    "attention_softmax_in_fp32": "attention_softmax_in_fp32",
    "apply_query_key_layer_scaling": "apply_query_key_layer_scaling",
    "calculate_per_token_loss": "calculate_per_token_loss",
    # recipe features (slime.utils.arguments.features)
    "rotary_interleaved": "rotary_interleaved",
    "attention_output_gate": "attention_output_gate",
    "apply_layernorm_1p": "layernorm_zero_centered_gamma",
    "moe_shared_expert_gate": "moe_shared_expert_gate",
    "deterministic_mode": "deterministic_mode",
}

_MOE_ONLY_FIELDS = {
    "moe_ffn_hidden_size",
    "moe_router_topk",
    "moe_router_score_function",
    "moe_token_dispatcher_type",
    "moe_grouped_gemm",
    "moe_aux_loss_coeff",
    "moe_router_pre_softmax",
    "moe_router_load_balancing_type",
    "moe_token_drop_policy",
    "moe_expert_capacity_factor",
    "moe_permute_fusion",
    "moe_shared_expert_intermediate_size",
    "moe_router_topk_scaling_factor",
    "moe_shared_expert_gate",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate",
}

# args dest -> MLATransformerConfig field, used with --multi-latent-attention only.
_MLA_FIELDS = {
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_head_dim": "qk_head_dim",
    "qk_pos_emb_head_dim": "qk_pos_emb_head_dim",
    "v_head_dim": "v_head_dim",
    "rope_type": "rope_type",
    "rotary_base": "rotary_base",
    "rotary_percent": "rotary_percent",
    "rotary_scaling_factor": "rotary_scaling_factor",
    "mscale": "mscale",
    "mscale_all_dim": "mscale_all_dim",
    "original_max_position_embeddings": "original_max_position_embeddings",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
}

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def params_dtype_from_args(args: argparse.Namespace) -> torch.dtype:
    """Parameter dtype: bf16 / fp16 when asked (``--bf16`` / ``--fp16``), float32 otherwise."""
    if getattr(args, "bf16", False):
        return torch.bfloat16
    if getattr(args, "fp16", False):
        return torch.float16
    return torch.float32


def parse_moe_layer_freq(value, num_layers: int):
    """``--moe-layer-freq`` as megatron takes it: an int N (every N-th layer is MoE) or a list of
    0/1 of length ``num_layers``. A string goes through the flag's own parser
    (`slime.utils.arguments.moe_layer_freq`, the one definition of the syntax)."""
    from slime.utils.arguments.moe_layer_freq import parse_moe_layer_freq as parse_text

    if isinstance(value, str):
        value = parse_text(value)
    if isinstance(value, int):
        return value
    value = [int(v) for v in value]
    if len(value) != num_layers:
        raise ValueError(
            f"--moe-layer-freq has {len(value)} entries but --num-layers is {num_layers}"
        )
    return value


def _moe_fields(args: argparse.Namespace) -> dict:
    """MoE-only TransformerConfig kwargs (empty for dense models)."""
    num_experts = getattr(args, "num_experts", None)
    if not num_experts:
        return {}
    kwargs = {"num_moe_experts": num_experts}
    freq = getattr(args, "moe_layer_freq", 1)
    kwargs["moe_layer_freq"] = parse_moe_layer_freq(freq if freq is not None else 1, args.num_layers)
    router_dtype = getattr(args, "moe_router_dtype", None)
    if router_dtype:
        kwargs["moe_router_dtype"] = router_dtype
    etp = getattr(args, "expert_tensor_parallel_size", None)
    if etp is not None:
        kwargs["expert_tensor_parallel_size"] = etp
    if getattr(args, "use_routing_replay", False):  # routers get megatron's RouterReplay (routing_replay.py)
        kwargs["moe_enable_routing_replay"] = True
    return kwargs


def _group_query_fields(args: argparse.Namespace) -> dict:
    """``num_query_groups`` only when GQA is on (megatron's default is MHA)."""
    groups = getattr(args, "num_query_groups", None)
    if groups and (getattr(args, "group_query_attention", True) or groups != args.num_attention_heads):
        return {"num_query_groups": groups}
    return {}


# Config fields set from a flag whose dest has another name (besides the copy tables above).
_DERIVED_FIELDS = {
    "gated_linear_unit": "swiglu", "activation_func": "swiglu", "num_moe_experts": "num_experts",
    "params_dtype": "bf16", "pipeline_dtype": "bf16", "moe_flex_dispatcher_backend": "moe_enable_deepep",
    "fp8": "fp8_format", "grad_reduce_in_fp32": "accumulate_allreduce_grads_in_fp32",
    "check_for_nan_in_grad": "check_for_nan_in_loss_and_grad", "bucket_size": "ddp_bucket_size",
    "average_in_collective": "ddp_average_in_collective",
}


def config_field_dests() -> dict[str, str]:
    """megatron-core config field -> the args dest it is built from, where the names differ (for
    naming our flags in megatron-core's messages); a field missing here has its dest's name."""
    table = {dst: src for src, dst in {**_TRANSFORMER_FIELDS, **_MLA_FIELDS}.items() if src != dst}
    return {**table, **_DERIVED_FIELDS, **{field: dest for field, (dest, _) in FUSION_FLAGS.items()}}


def _attention_backend_field(args: argparse.Namespace) -> dict:
    """``--attention-backend`` as megatron-core's ``AttnBackend`` enum (TransformerConfig field)."""
    backend = getattr(args, "attention_backend", None)
    if backend is None:
        return {}
    from megatron.core.transformer.enums import AttnBackend

    return {"attention_backend": AttnBackend[backend]}


def _gpu_feature_fields(args: argparse.Namespace) -> dict:
    """FP8 training and DeepEP (GPU only; refused without CUDA at start-up by
    ``slime.utils.arguments.features.startup_refusals``)."""
    kwargs = {}
    if getattr(args, "fp8_format", None):
        kwargs.update(fp8=args.fp8_format, fp8_recipe=args.fp8_recipe)
    if getattr(args, "moe_enable_deepep", False):
        kwargs["moe_flex_dispatcher_backend"] = "deepep"  # megatron-core 0.16's name for it
    return kwargs


def _mla_fields(args: argparse.Namespace) -> dict:
    """MLATransformerConfig kwargs for ``--multi-latent-attention`` (``q_lora_rank`` may be None:
    queries projected directly). ``--rope-type`` left unset: yarn when scaled, else rope."""
    kwargs = {dst: getattr(args, src) for src, dst in _MLA_FIELDS.items()
              if getattr(args, src, None) is not None}
    kwargs["q_lora_rank"] = getattr(args, "q_lora_rank", None)
    if kwargs.get("rope_type") is None:
        kwargs["rope_type"] = "yarn" if float(kwargs.get("rotary_scaling_factor", 1.0)) != 1.0 else "rope"
    kwargs["rotary_base"] = float(kwargs.get("rotary_base", 10000))
    return kwargs


def transformer_config_from_args(args: argparse.Namespace, kernels: Kernels | None = None, **overrides):
    """Build megatron-core ``TransformerConfig`` (``MLATransformerConfig`` with
    ``--multi-latent-attention``) for Qwen3, DeepSeek-V3 and GLM-4.5 families from Megatron-LM args.

    RMSNorm / LayerNorm from ``--normalization``, SwiGLU (gated linear unit + silu) from
    ``--swiglu``, bias from ``--disable-bias-linear`` (``add_bias_linear``), fp32 unless
    ``--bf16`` / ``--fp16``. ``kernels``: the run's machine (default: this one; see `Kernels`).
    ``overrides`` are passed last (e.g. ``pipeline_dtype``).
    """
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    kernels = kernels or Kernels.here()
    if getattr(args, "moe_permute_fusion", False) and not kernels.transformer_engine:
        raise ImportError(
            "--moe-permute-fusion needs Transformer Engine's fused permute kernels (GPU); "
            "install transformer_engine or drop the flag"
        )
    kwargs = {}
    for src, dst in _TRANSFORMER_FIELDS.items():
        value = getattr(args, src, None)
        if value is None or (dst in _MOE_ONLY_FIELDS and not getattr(args, "num_experts", None)):
            continue
        kwargs[dst] = value
    dtype = params_dtype_from_args(args)
    swiglu = bool(getattr(args, "swiglu", False))
    kwargs.update(
        normalization=getattr(args, "normalization", "LayerNorm") or "LayerNorm",
        gated_linear_unit=swiglu,
        activation_func=torch.nn.functional.silu if swiglu else torch.nn.functional.gelu,
        add_bias_linear=bool(getattr(args, "add_bias_linear", True)),
        add_qkv_bias=bool(getattr(args, "add_qkv_bias", False)),
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        bias_dropout_fusion=False,
        persist_layer_norm=False,
        use_cpu_initialization=not kernels.cuda,
    )
    kwargs.update(fusion_fields(args, kernels))
    kwargs.update(_attention_backend_field(args))
    kwargs.update(_group_query_fields(args))
    kwargs.update(_moe_fields(args))
    kwargs.update(_gpu_feature_fields(args))
    if getattr(args, "multi_latent_attention", False):
        kwargs.update(_mla_fields(args))
        kwargs.update(overrides)
        return MLATransformerConfig(**kwargs)
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def optimizer_config_from_args(args: argparse.Namespace, kernels: Kernels | None = None):
    """Build megatron-core ``OptimizerConfig`` (adam / sgd, lr, betas, eps, wd, clip, offload);
    ``kernels`` as in `transformer_config_from_args`."""
    from megatron.core.optimizer import OptimizerConfig

    dtype = params_dtype_from_args(args)
    kwargs = dict(
        optimizer=getattr(args, "optimizer", "adam") or "adam",
        lr=getattr(args, "lr", None),
        min_lr=getattr(args, "min_lr", None),
        weight_decay=getattr(args, "weight_decay", 0.01),
        adam_beta1=getattr(args, "adam_beta1", 0.9),
        adam_beta2=getattr(args, "adam_beta2", 0.999),
        adam_eps=getattr(args, "adam_eps", 1e-8),
        clip_grad=getattr(args, "clip_grad", 1.0),
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        params_dtype=dtype,
        use_distributed_optimizer=bool(getattr(args, "use_distributed_optimizer", False)),
        optimizer_cpu_offload=bool(getattr(args, "optimizer_cpu_offload", False)),
        overlap_cpu_optimizer_d2h_h2d=bool(getattr(args, "overlap_cpu_optimizer_d2h_h2d", False)),
        use_precision_aware_optimizer=bool(getattr(args, "use_precision_aware_optimizer", False)),
    )
    for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        value = getattr(args, name, None)
        if value is not None:
            kwargs[name] = _DTYPES[value] if isinstance(value, str) else value
    if getattr(args, "optimizer_offload_fraction", None) is not None:
        kwargs["optimizer_offload_fraction"] = args.optimizer_offload_fraction
    elif kwargs["optimizer_cpu_offload"]:
        kwargs["optimizer_offload_fraction"] = 1.0
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    check_precision_aware_optimizer(kwargs, kernels or Kernels.here())
    return OptimizerConfig(**kwargs)


def ddp_config_from_args(args: argparse.Namespace):
    """Build megatron-core ``DistributedDataParallelConfig`` from args."""
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=bool(getattr(args, "accumulate_allreduce_grads_in_fp32", False)),
        overlap_grad_reduce=bool(getattr(args, "overlap_grad_reduce", False)),
        overlap_param_gather=bool(getattr(args, "overlap_param_gather", False)),
        use_distributed_optimizer=bool(getattr(args, "use_distributed_optimizer", False)),
        check_for_nan_in_grad=bool(getattr(args, "check_for_nan_in_loss_and_grad", False)),
        bucket_size=getattr(args, "ddp_bucket_size", None),
        average_in_collective=bool(getattr(args, "ddp_average_in_collective", False)),
    )
