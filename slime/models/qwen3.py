"""Qwen3 dense (``Qwen3ForCausalLM``) and MoE (``Qwen3MoeForCausalLM``) weight maps.

Owns the rule tables for both architectures; the Megatron-LM model arguments derived from a
Qwen3 HF ``config.json`` are `slime.utils.arguments.hf_families.qwen3_args`.
"""

from slime.backends.megatron_utils.model_provider import padded_vocab_size
from slime.backends.megatron_utils.weight_maps import transforms as tf
from slime.backends.megatron_utils.weight_maps.base import ConvertContext, Rule, WeightMap
from slime.utils.arguments.hf_config import hf_num_experts
from slime.utils.arguments.hf_families import head_dim, rope_theta
from slime.utils.arguments.hf_families import qwen3_moe_layer_pattern as moe_layer_pattern

_L = "decoder.layers.{layer}."
_H = "model.layers.{layer}."

GLOBAL_RULES = [
    Rule(("embedding.word_embeddings.weight",), ("model.embed_tokens.weight",), "vocab", "vocab"),
    Rule(("decoder.final_layernorm.weight",), ("model.norm.weight",)),
]
UNTIED_OUTPUT = Rule(("output_layer.weight",), ("lm_head.weight",), "vocab", "vocab")
TIED_OUTPUT = Rule(("output_layer.weight",), ("model.embed_tokens.weight",), "vocab", "vocab")

ATTENTION_RULES = [
    Rule(
        (_L + "input_layernorm.weight", _L + "self_attention.linear_qkv.layer_norm_weight"),
        (_H + "input_layernorm.weight",),
    ),
    Rule(
        (_L + "self_attention.linear_qkv.weight",),
        (_H + "self_attn.q_proj.weight", _H + "self_attn.k_proj.weight", _H + "self_attn.v_proj.weight"),
        "qkv",
        "qkv",
    ),
    Rule((_L + "self_attention.q_layernorm.weight",), (_H + "self_attn.q_norm.weight",)),
    Rule((_L + "self_attention.k_layernorm.weight",), (_H + "self_attn.k_norm.weight",)),
    Rule((_L + "self_attention.linear_proj.weight",), (_H + "self_attn.o_proj.weight",), "copy", "row"),
]

DENSE_MLP_RULES = [
    Rule(
        (_L + "pre_mlp_layernorm.weight", _L + "mlp.linear_fc1.layer_norm_weight"),
        (_H + "post_attention_layernorm.weight",),
    ),
    Rule(
        (_L + "mlp.linear_fc1.weight",),
        (_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"),
        "gate_up",
        "gate_up",
    ),
    Rule((_L + "mlp.linear_fc2.weight",), (_H + "mlp.down_proj.weight",), "copy", "row"),
]

_E = _H + "mlp.experts.{expert}."
MOE_MLP_RULES = [
    Rule((_L + "pre_mlp_layernorm.weight",), (_H + "post_attention_layernorm.weight",)),
    Rule((_L + "mlp.router.weight",), (_H + "mlp.gate.weight",)),
    Rule(
        (
            _L + "mlp.experts.local_experts.{expert}.linear_fc1.weight",
            _L + "mlp.experts.linear_fc1.weight{expert}",
        ),
        (_E + "gate_proj.weight", _E + "up_proj.weight"),
        "gate_up",
        "gate_up",
        expert=True,
    ),
    Rule(
        (
            _L + "mlp.experts.local_experts.{expert}.linear_fc2.weight",
            _L + "mlp.experts.linear_fc2.weight{expert}",
        ),
        (_E + "down_proj.weight",),
        "copy",
        "row",
        expert=True,
    ),
]

def num_experts(hf_config: dict) -> int:
    """Routed experts in a Qwen3 config (0 for dense), read as argument validation reads it."""
    return hf_num_experts(hf_config)[1]


def build_weight_map(hf_config: dict, divisible_by: int = 128, tp_size: int = 1) -> WeightMap:
    """``WeightMap`` for a Qwen3 / Qwen3-MoE config; vocab padded to ``divisible_by * tp``."""
    pattern = moe_layer_pattern(hf_config)
    moe_rules = ATTENTION_RULES + MOE_MLP_RULES
    dense_rules = ATTENTION_RULES + DENSE_MLP_RULES
    tied = bool(hf_config.get("tie_word_embeddings", False))
    context = ConvertContext(
        attention=tf.AttentionShape(
            hf_config["num_attention_heads"],
            hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"],
            head_dim(hf_config),
        ),
        vocab_size=hf_config["vocab_size"],
        padded_vocab_size=padded_vocab_size(hf_config["vocab_size"], divisible_by, tp_size),
    )
    return WeightMap(
        global_rules=GLOBAL_RULES + [TIED_OUTPUT if tied else UNTIED_OUTPUT],
        layer_rules=lambda layer: moe_rules if pattern[layer] else dense_rules,
        num_layers=hf_config["num_hidden_layers"],
        num_experts=num_experts(hf_config),
        context=context,
    )
