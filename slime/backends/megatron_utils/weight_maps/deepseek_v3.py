"""DeepSeek-V3 (``DeepseekV3ForCausalLM``: DeepSeek-V3/R1, Kimi-K2, Moonlight) weight map.

Owns the rule tables of multi-latent attention (MLA), of the DeepSeek-style MoE MLP (sigmoid router
with ``e_score_correction_bias`` -> megatron's ``mlp.router.expert_bias``, routed experts, shared
experts; GLM-4.5 reuses it) and the Megatron-LM model args of a DeepSeek-V3 ``config.json``:
dense first layers (``first_k_dense_replace`` -> ``--moe-layer-freq``), group-limited routing,
``routed_scaling_factor``, YaRN rotary scaling.

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
from slime.utils.arguments.hf_config import hf_num_experts, hf_shape_args

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


def moe_layer_pattern(hf_config: dict) -> list:
    """0/1 per layer: dense for the first ``first_k_dense_replace`` layers, MoE after."""
    dense = int(hf_config.get("first_k_dense_replace") or 0)
    return [int(i >= dense) for i in range(hf_config["num_hidden_layers"])]


def rope_scaling(hf_config: dict) -> dict:
    """The rotary parameters dict (``rope_scaling`` as released, ``rope_parameters`` as
    transformers 5 writes it); empty when absent."""
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(hf_config.get(key), dict):
            return hf_config[key]
    return {}


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


def sigmoid_router_args(hf_config: dict) -> dict:
    """Megatron MoE args of a DeepSeek-style router (DeepSeek-V3, GLM-4.5): sigmoid scores with
    expert bias (``noaux_tc``), top-k renormalised then scaled by ``routed_scaling_factor``,
    group-limited routing, shared experts, dense first layers."""
    topk, groups = hf_config["num_experts_per_tok"], int(hf_config.get("n_group") or 1)
    group_topk = int(hf_config.get("topk_group") or 1)
    if hf_config.get("scoring_func", "sigmoid") != "sigmoid":
        raise ValueError(f"HF config scoring_func={hf_config['scoring_func']!r}: only sigmoid is supported")
    if not hf_config.get("norm_topk_prob", True):
        raise ValueError("HF config norm_topk_prob=false: megatron's sigmoid router always renormalises the top-k")
    if groups > 1 and topk != 2 * group_topk:
        raise ValueError(f"HF config n_group={groups}: megatron scores a group by its top "
                         f"num_experts_per_tok/topk_group={topk}/{group_topk} experts, transformers by its top 2")
    out = dict(  # the expert count, top-k and expert FFN size come from `hf_shape_args`
        moe_layer_freq=moe_layer_pattern(hf_config),
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=hf_config.get("topk_method", "noaux_tc") == "noaux_tc",
        moe_router_bias_update_rate=0.0,
        moe_router_topk_scaling_factor=float(hf_config.get("routed_scaling_factor") or 1.0),
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=0.0,
    )
    if groups > 1:
        out.update(moe_router_num_groups=groups, moe_router_group_topk=group_topk)
    if hf_config.get("n_shared_experts"):
        out["moe_shared_expert_intermediate_size"] = hf_config["n_shared_experts"] * hf_config["moe_intermediate_size"]
    return out


def yarn_args(hf_config: dict) -> dict:
    """YaRN rotary scaling args from ``rope_scaling`` (empty for plain RoPE)."""
    scaling = rope_scaling(hf_config)
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return {}
    return dict(
        rope_type="yarn",
        rotary_scaling_factor=float(scaling["factor"]),
        mscale=float(scaling.get("mscale", 1.0)),
        mscale_all_dim=float(scaling.get("mscale_all_dim", 0.0)),
        original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 4096)),
        beta_fast=float(scaling.get("beta_fast", 32.0)),
        beta_slow=float(scaling.get("beta_slow", 1.0)),
    )


def megatron_args(hf_config: dict) -> dict:
    """Megatron-LM model-shape args (dest names) equivalent to a DeepSeek-V3 HF config: the shared
    HF key -> flag table (`hf_shape_args`, MLA dims included) plus what the family implies."""
    out = hf_shape_args(hf_config)
    out.setdefault("norm_epsilon", 1e-6)
    out.update(
        multi_latent_attention=True,
        normalization="RMSNorm",
        position_embedding_type="rope",
        rotary_base=qwen3.rope_theta(hf_config),
        rotary_percent=1.0,
        swiglu=True,
        add_bias_linear=False,
        # the q / kv latent norms (megatron's MLA builds them with --qk-layernorm)
        qk_layernorm=True,
        untie_embeddings_and_output_weights=not hf_config.get("tie_word_embeddings", False),
        vocab_size=hf_config["vocab_size"],
        max_position_embeddings=hf_config.get("max_position_embeddings", 4096),
    )
    if hf_config.get("attention_bias"):
        raise ValueError("HF config attention_bias=true: megatron's MLA has no projection biases")
    if not hf_config.get("rope_interleave", True):
        raise ValueError("HF config rope_interleave=false: megatron's MLA rotates DeepSeek's interleaved "
                         "rotary layout only")
    out.update(yarn_args(hf_config))
    out.update(sigmoid_router_args(hf_config))
    return out  # no q_lora_rank: queries projected directly
