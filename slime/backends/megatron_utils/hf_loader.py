"""Moving weights between an HF checkpoint and a (sharded) megatron-core GPTModel.

Owns ``shard_context_for`` (this rank's ``ShardContext`` from megatron's
parallel_state and the model's layer numbers), ``load_hf_weights`` (fill every local
parameter from HF tensors through a ``WeightMap``), and MODEL_ARGS / args built from an HF
config. The way back (Megatron -> HF, any sharding) is ``weight_export``.
"""

import logging

import torch

from slime.models.weight_map import (
    ShardContext,
    WeightMap,
    global_name,
    shard_tensor,
)

logger = logging.getLogger(__name__)


def _first_layer_id(model) -> int:
    """Global (0-based) id of the model chunk's first decoder layer."""
    layers = model.decoder.layers
    return layers[0].layer_number - 1 if len(layers) else 0


def shard_context_for(model, num_experts: int) -> ShardContext:
    """``ShardContext`` of this rank for ``model`` (a GPTModel chunk, unwrapped)."""
    from megatron.core import parallel_state as mpu

    return ShardContext(
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        tp_size=mpu.get_tensor_model_parallel_world_size(),
        ep_rank=mpu.get_expert_model_parallel_rank(),
        ep_size=mpu.get_expert_model_parallel_world_size(),
        etp_rank=mpu.get_expert_tensor_parallel_rank(),
        etp_size=mpu.get_expert_tensor_parallel_world_size(),
        layer_offset=_first_layer_id(model),
        num_experts=num_experts,
    )


# Persistent buffers that are model weights: megatron's router expert bias (HF
# ``mlp.gate.e_score_correction_bias``). Loaded and exported like parameters.
_WEIGHT_BUFFERS = (".router.expert_bias",)


def mapped_tensors(model):
    """``(local name, tensor)`` of every HF-mapped weight of ``model``: its parameters, then the
    weight buffers (``_WEIGHT_BUFFERS``)."""
    yield from model.named_parameters()
    for name, buf in model.named_buffers():
        if buf is not None and name.endswith(_WEIGHT_BUFFERS):
            yield name, buf


@torch.no_grad()
def load_hf_weights(model, hf, wmap: WeightMap, ctx: ShardContext) -> int:
    """Copy HF tensors (``hf.get(name)``) into every parameter of ``model``'s local shard.

    Raises when a parameter has no mapping or a shard's shape differs from the
    parameter's. Returns the number of parameters filled.
    """
    count = 0
    for name, param in mapped_tensors(model):
        full_name = global_name(name, ctx)
        full = wmap.to_megatron(full_name, [hf.get(n) for n in wmap.hf_names(full_name)])
        shard = shard_tensor(wmap, full_name, full, ctx)
        if shard.shape != param.shape:
            raise ValueError(
                f"{name} (global {full_name}): HF gives shape {tuple(shard.shape)}, "
                f"model has {tuple(param.shape)}; do MODEL_ARGS match the HF config?"
            )
        param.copy_(shard.to(param.dtype))  # expert_bias keeps its float32
        count += 1
    logger.info("loaded %d HF-mapped parameters", count)
    return count


# Non-shape defaults for a model built from an HF config alone (converters, tests).
_RUNTIME_DEFAULTS = dict(
    tensor_model_parallel_size=1,
    pipeline_model_parallel_size=1,
    context_parallel_size=1,
    expert_model_parallel_size=1,
    expert_tensor_parallel_size=1,
    sequence_parallel=False,
    transformer_impl="local",
    moe_token_dispatcher_type="allgather",
    moe_grouped_gemm=False,
    moe_router_dtype="fp32",
    bf16=False,
    attention_dropout=0.0,
    hidden_dropout=0.0,
    init_method_std=0.02,
    make_vocab_size_divisible_by=128,
    seed=1234,
)


def args_from_hf_config(hf_config: dict, **overrides):
    """Megatron-LM style Namespace for an HF config (shape from the weight-map registry).

    Parallel sizes default to 1, ``--transformer-impl local``, fp32; ``overrides`` win.
    """
    import argparse

    from slime.models import model_family

    values = dict(_RUNTIME_DEFAULTS)
    values.update(model_family(hf_config).megatron_args(hf_config))
    values.update(overrides)
    return argparse.Namespace(**values)


# shape args that have no flag of their own in MODEL_ARGS (derived by megatron or defaults)
_NOT_FLAGS = {"moe_router_pre_softmax", "moe_router_load_balancing_type", "moe_aux_loss_coeff"}


def model_flags_from_hf_config(hf_config: dict) -> list[str]:
    """MODEL_ARGS (Megatron-LM flags) equivalent to an HF config, via the weight-map registry;
    MoE models get `--moe-aux-loss-coeff 0` as slime's recipes do."""
    from slime.models import model_family

    shape = model_family(hf_config).megatron_args(hf_config)
    argv = []
    for key, value in shape.items():
        flag = "--" + key.replace("_", "-")
        if key == "add_bias_linear":
            argv += [] if value else ["--disable-bias-linear"]
        elif key in _NOT_FLAGS or value is False:
            continue
        elif value is True:
            argv.append(flag)
        elif isinstance(value, float) and value.is_integer() and key != "norm_epsilon":
            argv += [flag, str(int(value))]  # Megatron-LM's --rotary-base is an int
        else:
            argv += [flag, str(value)]
    return argv + ["--moe-aux-loss-coeff", "0"] if "num_experts" in shape else argv
