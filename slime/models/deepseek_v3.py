"""DeepSeek-V3 (``DeepseekV3ForCausalLM``: DeepSeek-V3/R1, Kimi-K2, Moonlight) weight map.

Owns the rule tables of multi-latent attention (MLA), of the DeepSeek-style MoE MLP (sigmoid router
with ``e_score_correction_bias`` -> megatron's ``mlp.router.expert_bias``, routed experts, shared
experts; GLM-4.5 reuses it). The Megatron-LM model args of a DeepSeek-V3 ``config.json`` (dense
first layers, group-limited routing, ``routed_scaling_factor``, YaRN) are
`slime.utils.arguments.hf_families.deepseek_v3_args`.

Rotary layout: transformers applies DeepSeek's RoPE to de-interleaved rotary dims when
``rope_interleave`` is true (its default; released configs leave it unset), and megatron-core's
MLA de-interleaves the same way (``rope_utils._apply_rotary_pos_emb_bshd`` with
``multi_latent_attention``), so every tensor is a plain copy. ``rope_interleave: false`` has no
megatron equivalent and is refused.
"""

from slime.backends.megatron_utils.model_provider import padded_vocab_size
from slime.backends.megatron_utils.weight_maps import qwen3
from slime.backends.megatron_utils.weight_maps import transforms as tf
from slime.backends.megatron_utils.weight_maps.base import ConvertContext, Rule, WeightMap
from slime.utils.arguments.hf_config import hf_num_experts
from slime.utils.arguments.hf_families import dense_first_layer_pattern as moe_layer_pattern

_L = "decoder.layers.{layer}."
_H = "model.layers.{layer}."
_A = _L + "self_attention."
_HA = _H + "self_attn."

INPUT_NORM = Rule((_L + "input_layernorm.weight",), (_H + "input_layernorm.weight",))
ATTENTION_OUT = Rule((_A + "linear_proj.weight",), (_HA + "o_proj.weight",), "copy", "row")
# MLA's down projections are whole on every TP rank (TE's duplicated TELinear; the local spec the same).
KV_RULES = [
    Rule((_A + "linear_kv_down_proj.weight",), (_HA + "kv_a_proj_with_mqa.weight",)),
    Rule((_A + "kv_layernorm.weight", _A + "linear_kv_up_proj.layer_norm_weight"), (_HA + "kv_a_layernorm.weight",)),
    Rule((_A + "linear_kv_up_proj.weight",), (_HA + "kv_b_proj.weight",), "copy", "column"),
]
Q_LORA_RULES = [
    Rule((_A + "linear_q_down_proj.weight",), (_HA + "q_a_proj.weight",)),
    Rule((_A + "q_layernorm.weight", _A + "linear_q_up_proj.layer_norm_weight"), (_HA + "q_a_layernorm.weight",)),
    Rule((_A + "linear_q_up_proj.weight",), (_HA + "q_b_proj.weight",), "copy", "column"),
]
Q_DIRECT_RULES = [Rule((_A + "linear_q_proj.weight",), (_HA + "q_proj.weight",), "copy", "column")]

_M = _L + "mlp."
_HM = _H + "mlp."
MOE_ROUTER_RULES = [
    Rule((_L + "pre_mlp_layernorm.weight",), (_H + "post_attention_layernorm.weight",)),
    Rule((_M + "router.weight",), (_HM + "gate.weight",)),
    Rule((_M + "router.expert_bias",), (_HM + "gate.e_score_correction_bias",)),
]
SHARED_EXPERT_RULES = [
    Rule((_M + "shared_experts.linear_fc1.weight",),
         (_HM + "shared_experts.gate_proj.weight", _HM + "shared_experts.up_proj.weight"), "gate_up", "gate_up"),
    Rule((_M + "shared_experts.linear_fc2.weight",), (_HM + "shared_experts.down_proj.weight",), "copy", "row"),
]
# routed experts: the same names as Qwen3-MoE (mlp.experts.{e}.gate/up/down_proj)
ROUTED_EXPERT_RULES = qwen3.MOE_MLP_RULES[2:]


def moe_mlp_rules(hf_config: dict) -> list:
    """Rules of a DeepSeek-style MoE MLP: norm, router (+ expert bias), experts, shared experts."""
    rules = MOE_ROUTER_RULES + ROUTED_EXPERT_RULES
    return rules + SHARED_EXPERT_RULES if hf_config.get("n_shared_experts") else rules


def context_for(hf_config: dict, divisible_by: int, tp_size: int, head_dim: int) -> ConvertContext:
    """Converter context: attention shape (heads, KV heads, head dim) and vocab sizes."""
    heads = hf_config["num_attention_heads"]
    return ConvertContext(
        attention=tf.AttentionShape(heads, hf_config.get("num_key_value_heads") or heads, head_dim),
        vocab_size=hf_config["vocab_size"],
        padded_vocab_size=padded_vocab_size(hf_config["vocab_size"], divisible_by, tp_size),
    )


def output_rules(hf_config: dict) -> list:
    """Embedding, final norm and (tied or untied) output layer."""
    tied = bool(hf_config.get("tie_word_embeddings", False))
    return qwen3.GLOBAL_RULES + [qwen3.TIED_OUTPUT if tied else qwen3.UNTIED_OUTPUT]


def build_weight_map(hf_config: dict, divisible_by: int = 128, tp_size: int = 1) -> WeightMap:
    """``WeightMap`` for a DeepSeek-V3 config; vocab padded to ``divisible_by * tp``."""
    pattern = moe_layer_pattern(hf_config)
    q_rules = Q_LORA_RULES if hf_config.get("q_lora_rank") else Q_DIRECT_RULES
    attention = [INPUT_NORM] + q_rules + KV_RULES + [ATTENTION_OUT]
    moe_rules = attention + moe_mlp_rules(hf_config)
    dense_rules = attention + qwen3.DENSE_MLP_RULES
    return WeightMap(
        global_rules=output_rules(hf_config),
        layer_rules=lambda layer: moe_rules if pattern[layer] else dense_rules,
        num_layers=hf_config["num_hidden_layers"],
        num_experts=hf_num_experts(hf_config)[1],
        context=context_for(hf_config, divisible_by, tp_size, hf_config["v_head_dim"]),
    )
