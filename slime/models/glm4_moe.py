"""GLM-4.5 / GLM-4.5-Air / GLM-4.7 MoE (``Glm4MoeForCausalLM``) weight map.

Owns the GLM-4.5 rule table (its Megatron-LM model args are
`slime.utils.arguments.hf_families.glm4_moe_args`): GQA attention with QKV biases, optional
per-head QK norms (``use_qk_norm``), partial rotary (``partial_rotary_factor`` ->
``--rotary-percent``, rotate-half on the first part of each head as megatron does), dense first
layers and the DeepSeek-style MoE MLP (sigmoid router with expert bias, shared experts), whose
rules come from ``deepseek_v3``. The multi-token-prediction layers of the
released checkpoints (``num_nextn_predict_layers``) are not part of the model transformers
builds and are not mapped.
"""

from slime.backends.megatron_utils.weight_maps import deepseek_v3, qwen3
from slime.backends.megatron_utils.weight_maps.base import Rule, WeightMap
from slime.utils.arguments.hf_config import hf_num_experts

_L = "decoder.layers.{layer}."
_H = "model.layers.{layer}."

QKV_BIAS = Rule(
    (_L + "self_attention.linear_qkv.bias",),
    (_H + "self_attn.q_proj.bias", _H + "self_attn.k_proj.bias", _H + "self_attn.v_proj.bias"),
    "qkv",
    "qkv",
)
# Qwen3's attention rows: input norm, fused QKV, q/k norms, output projection.
_INPUT_NORM, _QKV, _Q_NORM, _K_NORM, _OUT = qwen3.ATTENTION_RULES


def attention_rules(hf_config: dict) -> list:
    """Attention rules: QKV (+ bias with ``attention_bias``), q/k norms with ``use_qk_norm``."""
    rules = [_INPUT_NORM, _QKV]
    if hf_config.get("attention_bias"):
        rules.append(QKV_BIAS)
    if hf_config.get("use_qk_norm"):
        rules += [_Q_NORM, _K_NORM]
    return rules + [_OUT]


def build_weight_map(hf_config: dict, divisible_by: int = 128, tp_size: int = 1) -> WeightMap:
    """``WeightMap`` for a GLM-4.5 MoE config; vocab padded to ``divisible_by * tp``."""
    pattern = deepseek_v3.moe_layer_pattern(hf_config)
    attention = attention_rules(hf_config)
    moe_rules = attention + deepseek_v3.moe_mlp_rules(hf_config)
    dense_rules = attention + qwen3.DENSE_MLP_RULES
    return WeightMap(
        global_rules=deepseek_v3.output_rules(hf_config),
        layer_rules=lambda layer: moe_rules if pattern[layer] else dense_rules,
        num_layers=hf_config["num_hidden_layers"],
        num_experts=hf_num_experts(hf_config)[1],
        context=deepseek_v3.context_for(hf_config, divisible_by, tp_size, qwen3.head_dim(hf_config)),
    )
