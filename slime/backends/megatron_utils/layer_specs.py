"""Transformer layer specs for the Megatron backend.

Owns the choice between Transformer Engine specs (``--transformer-impl
transformer_engine``, GPU) and our local spec (``local``): megatron-core's local
GPT spec with every RMSNorm swapped for ``SequenceParallelRMSNorm`` so TP > 1 with
sequence parallel (required by MoE) works without Transformer Engine, and its
``DotProductAttention`` swapped for ``PackedDotProductAttention``, which runs packed
micro-batches (``PackedSeqParams``, THD) as Transformer Engine does on GPU. With
``multi_latent_attention`` in the config megatron-core's local spec builds ``MLASelfAttention``;
the same swaps apply, its q / kv down projections are duplicated on every TP rank as in the
Transformer Engine spec, and the packed attention takes MLA's differing query/key and value head
dims.
"""

import copy
import importlib
import logging

logger = logging.getLogger(__name__)


def _require_transformer_engine() -> None:
    """Raise a clear error when ``--transformer-impl transformer_engine`` lacks TE."""
    from megatron.core.extensions import transformer_engine as te_ext

    if not getattr(te_ext, "HAVE_TE", False):
        raise ImportError(
            "--transformer-impl transformer_engine needs the transformer_engine package "
            "(GPU only: pip install transformer_engine[pytorch]); use --transformer-impl local "
            "on CPU (with --context-parallel-size 1: context parallelism needs Transformer Engine)"
        )


def _local_layer(layer_spec, rms_norm: bool):
    """Deep-copied layer spec with our core attention and, under RMSNorm, our norms (input,
    pre-MLP, q/k; with multi-latent attention the q and kv latent norms)."""
    from megatron.core.transformer.identity_op import IdentityOp

    from slime.backends.megatron_utils.sp_norm import SequenceParallelRMSNorm

    spec = copy.deepcopy(layer_spec)
    sub = spec.submodules
    attn = sub.self_attention.submodules
    _swap_core_attention(attn)
    _replicate_mla_down_projections(attn)
    if not rms_norm:
        return spec
    sub.input_layernorm = SequenceParallelRMSNorm
    sub.pre_mlp_layernorm = SequenceParallelRMSNorm
    for name in ("q_layernorm", "k_layernorm", "kv_layernorm"):  # kv_layernorm: MLA's latent norm
        if getattr(attn, name, IdentityOp) is not IdentityOp:
            setattr(attn, name, SequenceParallelRMSNorm)
    if _is_moe(sub.mlp) and sub.sharded_state_dict_keys_map:
        # TE MoE layers keep a separate pre_mlp_layernorm (no fused fc1 norm); megatron's
        # local spec maps it to mlp.linear_fc1.layer_norm_ anyway. Drop that entry so the
        # checkpoint keys match the TE layout and checkpoints move between impls.
        sub.sharded_state_dict_keys_map = {
            k: v for k, v in sub.sharded_state_dict_keys_map.items() if k != "pre_mlp_layernorm."
        }
    return spec


def _replicate_mla_down_projections(attn_submodules) -> None:
    """MLA's q / kv down projections: megatron's local spec makes them column-parallel, the
    Transformer Engine spec duplicates them on every TP rank (``TELinear``, ``duplicated``). Use
    megatron-core's local duplicated linear (``post_training.modelopt.layers.Linear``: whole weight
    on each TP rank, gradient reduced over TP under sequence parallel, as TE's) so both specs hold
    and checkpoint the same tensors and one weight map serves both."""
    from megatron.core.post_training.modelopt.layers import Linear

    for name in ("linear_q_down_proj", "linear_kv_down_proj"):
        if getattr(attn_submodules, name, None) is not None:
            setattr(attn_submodules, name, Linear)


def _swap_core_attention(attn_submodules) -> None:
    """megatron's DotProductAttention (no packed sequences) -> our PackedDotProductAttention."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from slime.backends.megatron_utils.packed_attention import PackedDotProductAttention

    if attn_submodules.core_attention is DotProductAttention:
        attn_submodules.core_attention = PackedDotProductAttention


def _is_moe(mlp_spec) -> bool:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    return getattr(mlp_spec, "module", None) is MoELayer


def local_block_spec(config, vp_stage=None, pp_rank=None):
    """Decoder block spec of megatron-core local modules for this PP stage.

    Core attention is ``PackedDotProductAttention``; with RMSNorm every norm is
    ``SequenceParallelRMSNorm``; MoE layers use ``SequentialMLP`` experts
    (``mlp.experts.local_experts.{i}``).
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if config.num_moe_experts and config.moe_grouped_gemm:
        raise ValueError(
            "--moe-grouped-gemm needs --transformer-impl transformer_engine (TEGroupedMLP); "
            "the local spec runs experts as SequentialMLP: drop --moe-grouped-gemm"
        )
    block = get_gpt_decoder_block_spec(
        config,
        use_transformer_engine=False,
        normalization=config.normalization,
        vp_stage=vp_stage,
        pp_rank=pp_rank,
    )
    rms_norm = config.normalization == "RMSNorm"
    swapped = {}
    layers = []
    for spec in block.layer_specs:
        if id(spec) not in swapped:
            swapped[id(spec)] = _local_layer(spec, rms_norm)
        layers.append(swapped[id(spec)])
    block.layer_specs = layers
    if rms_norm:
        from slime.backends.megatron_utils.sp_norm import SequenceParallelRMSNorm

        block.layer_norm = SequenceParallelRMSNorm
    return block


def te_block_spec(config, vp_stage=None, pp_rank=None):
    """Decoder block spec of Transformer Engine modules for this PP stage (GPU only)."""
    _require_transformer_engine()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    return get_gpt_decoder_block_spec(
        config,
        use_transformer_engine=True,
        normalization=config.normalization,
        vp_stage=vp_stage,
        pp_rank=pp_rank,
    )


BLOCK_SPECS = {"local": local_block_spec, "transformer_engine": te_block_spec}


def block_spec_for(transformer_impl: str, config, vp_stage=None, pp_rank=None):
    """Look up ``--transformer-impl`` in ``BLOCK_SPECS`` and build the block spec."""
    if transformer_impl not in BLOCK_SPECS:
        raise ValueError(
            f"--transformer-impl {transformer_impl!r} is not one of {sorted(BLOCK_SPECS)}"
        )
    return BLOCK_SPECS[transformer_impl](config, vp_stage=vp_stage, pp_rank=pp_rank)


def load_layer_spec(spec: list[str], args, config, vp_stage=None):
    """``--spec MODULE FUNCTION`` as slime loads it: ``getattr(import_module(MODULE), FUNCTION)`` is
    a layer / block spec used as is, or a callable returning one, called ``FUNCTION(args, config,
    vp_stage)``. Errors name the flag, the module and what failed."""
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    module_name, attr = spec
    where = f"--spec {module_name} {attr}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"{where}: cannot import module {module_name!r} ({error})") from error
    if not hasattr(module, attr):
        raise AttributeError(f"{where}: module {module_name!r} has no attribute {attr!r}")
    target = getattr(module, attr)
    if callable(target) and not isinstance(target, (ModuleSpec, TransformerBlockSubmodules)):
        try:
            target = target(args, config, vp_stage)
        except Exception as error:
            raise RuntimeError(f"{where}: {module_name}.{attr}(args, config, vp_stage) raised "
                               f"{type(error).__name__}: {error}") from error
    if not isinstance(target, (ModuleSpec, TransformerBlockSubmodules)):
        raise TypeError(f"{where}: expected a ModuleSpec or TransformerBlockSubmodules, got {type(target).__name__}")
    return target
