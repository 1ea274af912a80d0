"""GLM-4.5 / GLM-4.5-Air / GLM-4.6 / GLM-4.7 MoE (``Glm4MoeForCausalLM``): the whole family.

Owns the Megatron-LM model args of a GLM-4.5 ``config.json`` and its rule table: GQA attention with
QKV biases, optional per-head QK norms (``use_qk_norm``), partial rotary (``partial_rotary_factor``
-> ``--rotary-percent``, rotate-half on the first part of each head as megatron does), dense first
layers and the DeepSeek-style MoE MLP (sigmoid router with expert bias, shared experts), whose args
and rules come from `slime.models.deepseek_v3`; and the tiny ``glm4_moe`` variant. The
multi-token-prediction layers of the released checkpoints (``num_nextn_predict_layers``) are not
part of the model transformers builds and are not mapped.
"""

from __future__ import annotations

from types import MappingProxyType

from slime.models import common_rules as rows
from slime.models import deepseek_v3
from slime.models.family import ModelFamily, TinyVariant
from slime.models.hf_args import common_args, head_dim, hf_num_experts, rope_scaling
from slime.models.tiny import gqa_shapes
from slime.models.weight_map import WeightMap


def partial_rotary_factor(hf_config: dict) -> float:
    """Fraction of each head that is rotated (top level or inside ``rope_parameters``; GLM-4.5: 0.5)."""
    value = hf_config.get("partial_rotary_factor")
    if value is None:
        value = rope_scaling(hf_config).get("partial_rotary_factor", 1.0)
    return float(value)


def megatron_args(hf_config: dict) -> dict:
    """GQA with QKV biases and optional QK norms, partial rotary, the DeepSeek-style router."""
    out = common_args(hf_config, 1e-5)
    out.update(
        group_query_attention=True,
        num_query_groups=hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"],
        kv_channels=head_dim(hf_config),
        rotary_percent=partial_rotary_factor(hf_config),
        add_qkv_bias=bool(hf_config.get("attention_bias", False)),
        qk_layernorm=bool(hf_config.get("use_qk_norm", False)),
    )
    out.update(deepseek_v3.sigmoid_router_args(hf_config))
    return out


# The standard attention rows: input norm, fused QKV, q/k norms, output projection.
_INPUT_NORM, _QKV, _Q_NORM, _K_NORM, _OUT = rows.ATTENTION_RULES


def attention_rules(hf_config: dict) -> list:
    """Attention rules: QKV (+ bias with ``attention_bias``), q/k norms with ``use_qk_norm``."""
    rules = [_INPUT_NORM, _QKV]
    if hf_config.get("attention_bias"):
        rules.append(rows.QKV_BIAS)
    if hf_config.get("use_qk_norm"):
        rules += [_Q_NORM, _K_NORM]
    return rules + [_OUT]


def build_weight_map(hf_config: dict, divisible_by: int = 128, tp_size: int = 1) -> WeightMap:
    """``WeightMap`` for a GLM-4.5 MoE config; vocab padded to ``divisible_by * tp``."""
    pattern = deepseek_v3.moe_layer_pattern(hf_config)
    attention = attention_rules(hf_config)
    moe_rules = attention + deepseek_v3.moe_mlp_rules(hf_config)
    dense_rules = attention + rows.DENSE_MLP_RULES
    return WeightMap(
        global_rules=rows.output_rules(hf_config),
        layer_rules=lambda layer: moe_rules if pattern[layer] else dense_rules,
        num_layers=hf_config["num_hidden_layers"],
        num_experts=hf_num_experts(hf_config)[1],
        context=rows.context_for(hf_config, divisible_by, tp_size, head_dim(hf_config)),
    )


# GLM-4.5 keys as released; partial rotary: half of each 16-dim head.
TINY = TinyVariant(
    config=MappingProxyType({
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "attention_bias": True,
        "use_qk_norm": True,
        "partial_rotary_factor": 0.5,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "num_nextn_predict_layers": 0,
    }),
    script="glm4.5-tiny.sh",
    recipe_match=lambda a: "--add-qkv-bias" in a and "--num-experts" in a and "--multi-latent-attention" not in a,
)

FAMILY = ModelFamily(
    name="glm4_moe",
    # GLM-4.5, GLM-4.5-Air, GLM-4.6 and GLM-4.7
    architectures=("Glm4MoeForCausalLM",),
    megatron_args=megatron_args,
    build_weight_map=build_weight_map,
    tiny_variants=MappingProxyType({"glm4_moe": TINY}),
    tiny_attention_shapes=gqa_shapes,
)
