"""Weight rules of Hugging Face's standard decoder layout, shared by the family modules.

Owns the rows every family in `slime.models` has in the same form (embedding, final norm, tied or
untied output layer; GQA attention with a fused QKV and optional QKV biases and per-head QK norms;
the SwiGLU MLP, dense or per routed expert; the MoE router), and the converter context of a
config. A family module composes its layers from these rows and adds its own.
"""

from __future__ import annotations

from slime.models import transforms as tf
from slime.models.weight_map import ConvertContext, Rule, padded_vocab_size

_L = "decoder.layers.{layer}."
_H = "model.layers.{layer}."

GLOBAL_RULES = [
    Rule(("embedding.word_embeddings.weight",), ("model.embed_tokens.weight",), "vocab", "vocab"),
    Rule(("decoder.final_layernorm.weight",), ("model.norm.weight",)),
]
UNTIED_OUTPUT = Rule(("output_layer.weight",), ("lm_head.weight",), "vocab", "vocab")
TIED_OUTPUT = Rule(("output_layer.weight",), ("model.embed_tokens.weight",), "vocab", "vocab")

# GQA attention: input norm, fused QKV, q/k norms, output projection.
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
QKV_BIAS = Rule(
    (_L + "self_attention.linear_qkv.bias",),
    (_H + "self_attn.q_proj.bias", _H + "self_attn.k_proj.bias", _H + "self_attn.v_proj.bias"),
    "qkv",
    "qkv",
)

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
# MoE MLP: pre-MLP norm, router, then one SwiGLU per routed expert (mlp.experts.{e}.gate/up/down_proj).
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
ROUTED_EXPERT_RULES = MOE_MLP_RULES[2:]


def output_rules(hf_config: dict) -> list:
    """Embedding, final norm and (tied or untied) output layer."""
    tied = bool(hf_config.get("tie_word_embeddings", False))
    return GLOBAL_RULES + [TIED_OUTPUT if tied else UNTIED_OUTPUT]


def context_for(hf_config: dict, divisible_by: int, tp_size: int, head_dim: int) -> ConvertContext:
    """Converter context: attention shape (heads, KV heads, head dim) and vocab sizes."""
    heads = hf_config["num_attention_heads"]
    return ConvertContext(
        attention=tf.AttentionShape(heads, hf_config.get("num_key_value_heads") or heads, head_dim),
        vocab_size=hf_config["vocab_size"],
        padded_vocab_size=padded_vocab_size(hf_config["vocab_size"], divisible_by, tp_size),
    )
