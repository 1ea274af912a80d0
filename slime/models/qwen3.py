"""Qwen3 dense (``Qwen3ForCausalLM``) and MoE (``Qwen3MoeForCausalLM``): the whole family.

Owns the Megatron-LM model args of a Qwen3 ``config.json`` (GQA with per-head QK norms, full
rotary, softmax router; sparse layers from ``decoder_sparse_step`` / ``mlp_only_layers``), the rule
table of both architectures (HF's standard layout, `slime.models.common_rules`), and the tiny
``moe`` (the Qwen3-30B-A3B structure) and ``dense`` variants. SGLang fuses nothing of it across
weight-update calls.
"""

from __future__ import annotations

from functools import partial
from types import MappingProxyType

from slime.models import common_rules as rows
from slime.models.family import ModelFamily, TinyVariant
from slime.models.hf_args import common_args, head_dim, hf_num_experts
from slime.models.tiny import gqa_shapes
from slime.models.weight_map import WeightMap


def moe_layer_pattern(hf_config: dict) -> list:
    """0/1 per layer: 1 where Qwen3-MoE puts a sparse MLP (``decoder_sparse_step``, ``mlp_only_layers``)."""
    layers = hf_config["num_hidden_layers"]
    if not hf_num_experts(hf_config)[1]:
        return [0] * layers
    step = hf_config.get("decoder_sparse_step", 1) or 1
    dense = set(hf_config.get("mlp_only_layers") or [])
    return [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]


def megatron_args(hf_config: dict) -> dict:
    """Qwen3 dense and MoE: GQA with per-head QK norms, full rotary, softmax router."""
    out = common_args(hf_config, 1e-6)
    out.update(
        group_query_attention=True,
        num_query_groups=hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"],
        kv_channels=head_dim(hf_config),
        rotary_percent=1.0,
        add_qkv_bias=bool(hf_config.get("attention_bias", False)),
        qk_layernorm=True,
    )
    if hf_num_experts(hf_config)[1]:
        out.update(
            moe_layer_freq=moe_layer_pattern(hf_config),
            moe_router_score_function="softmax",
            moe_router_pre_softmax=not hf_config.get("norm_topk_prob", False),
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=hf_config.get("router_aux_loss_coef", 0.0),
        )
    return out


def num_experts(hf_config: dict) -> int:
    """Routed experts in a Qwen3 config (0 for dense), read as argument validation reads it."""
    return hf_num_experts(hf_config)[1]


def build_weight_map(hf_config: dict, divisible_by: int = 128, tp_size: int = 1) -> WeightMap:
    """``WeightMap`` for a Qwen3 / Qwen3-MoE config; vocab padded to ``divisible_by * tp``."""
    pattern = moe_layer_pattern(hf_config)
    moe_rules = rows.ATTENTION_RULES + rows.MOE_MLP_RULES
    dense_rules = rows.ATTENTION_RULES + rows.DENSE_MLP_RULES
    return WeightMap(
        global_rules=rows.output_rules(hf_config),
        layer_rules=lambda layer: moe_rules if pattern[layer] else dense_rules,
        num_layers=hf_config["num_hidden_layers"],
        num_experts=num_experts(hf_config),
        context=rows.context_for(hf_config, divisible_by, tp_size, head_dim(hf_config)),
    )


# Keys of Qwen3's config.json that the other families do not declare.
_QWEN_KEYS = {"use_sliding_window": False, "sliding_window": None, "max_window_layers": 2}
_STANDARD = ("--multi-latent-attention", "--add-qkv-bias")

TINY_MOE = TinyVariant(
    config=MappingProxyType({
        **_QWEN_KEYS,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    }),
    script="qwen3-tiny-moe.sh",
    recipe_match=lambda a: "--num-experts" in a and not any(f in a for f in _STANDARD),
)
TINY_DENSE = TinyVariant(
    config=MappingProxyType({**_QWEN_KEYS, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}),
    script="qwen3-tiny.sh",
    recipe_match=lambda a: "--num-experts" not in a and not any(f in a for f in _STANDARD),
)

FAMILY = ModelFamily(
    name="qwen3",
    architectures=("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
    megatron_args=megatron_args,
    build_weight_map=build_weight_map,
    tiny_variants=MappingProxyType({"moe": TINY_MOE, "dense": TINY_DENSE}),
    tiny_attention_shapes=partial(gqa_shapes, qk_norm_default=True),
)
