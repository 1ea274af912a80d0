"""DeepSeek-V3 (``DeepseekV3ForCausalLM``: DeepSeek-V3/R1, Kimi-K2, Moonlight): the whole family.

Owns the Megatron-LM model args of a DeepSeek-V3 ``config.json`` (multi-latent attention, dense
first layers, the sigmoid router with expert bias, group-limited routing, ``routed_scaling_factor``,
shared experts, YaRN), the rule tables of multi-latent attention (MLA) and of the DeepSeek-style
MoE MLP (sigmoid router with ``e_score_correction_bias`` -> megatron's ``mlp.router.expert_bias``,
routed experts, shared experts; GLM-4.5 reuses the router and the MLP), the tensors SGLang fuses
on load, and the tiny ``deepseek_v3`` variant.

Rotary layout: transformers applies DeepSeek's RoPE to de-interleaved rotary dims when
``rope_interleave`` is true (its default; released configs leave it unset), and megatron-core's
MLA de-interleaves the same way (``rope_utils._apply_rotary_pos_emb_bshd`` with
``multi_latent_attention``), so every tensor is a plain copy. ``rope_interleave: false`` has no
megatron equivalent and is refused.

Fused tensors (SGLang 0.5.23 ``models/deepseek_common/deepseek_weight_loader.py`` and 0.5.15.post1
``models/deepseek_v2.py``): with ``q_lora_rank`` set, DeepSeek-V2/V3's loader concatenates
``q_a_proj`` and ``kv_a_proj_with_mqa`` (weights, and FP8 ``weight_scale_inv`` alike) into
``fused_qkv_a_proj_with_mqa`` once both halves are cached.
"""

from __future__ import annotations

from types import MappingProxyType

from slime.models import common_rules as rows
from slime.models.family import ModelFamily, TinyVariant
from slime.models.hf_args import common_args, hf_num_experts, yarn_args
from slime.models.weight_map import Rule, WeightMap


# ---- Megatron-LM model args ---------------------------------------------------------------------

def moe_layer_pattern(hf_config: dict) -> list:
    """0/1 per layer: dense for the first ``first_k_dense_replace`` layers, MoE after."""
    dense = int(hf_config.get("first_k_dense_replace") or 0)
    return [int(i >= dense) for i in range(hf_config["num_hidden_layers"])]


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


def megatron_args(hf_config: dict) -> dict:
    """Multi-latent attention (MLA dims from `hf_shape_args`), the sigmoid router, YaRN."""
    out = common_args(hf_config, 1e-6)
    out.update(
        multi_latent_attention=True,
        rotary_percent=1.0,
        # the q / kv latent norms (megatron's MLA builds them with --qk-layernorm)
        qk_layernorm=True,
    )
    if hf_config.get("attention_bias"):
        raise ValueError("HF config attention_bias=true: megatron's MLA has no projection biases")
    if not hf_config.get("rope_interleave", True):
        raise ValueError("HF config rope_interleave=false: megatron's MLA rotates DeepSeek's interleaved "
                         "rotary layout only")
    out.update(yarn_args(hf_config))
    out.update(sigmoid_router_args(hf_config))
    return out  # no q_lora_rank: queries projected directly


# ---- weight rules -------------------------------------------------------------------------------

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
# routed experts: HF's standard names (mlp.experts.{e}.gate/up/down_proj)
ROUTED_EXPERT_RULES = rows.ROUTED_EXPERT_RULES


def moe_mlp_rules(hf_config: dict) -> list:
    """Rules of a DeepSeek-style MoE MLP: norm, router (+ expert bias), experts, shared experts."""
    rules = MOE_ROUTER_RULES + ROUTED_EXPERT_RULES
    return rules + SHARED_EXPERT_RULES if hf_config.get("n_shared_experts") else rules


def build_weight_map(hf_config: dict, divisible_by: int = 128, tp_size: int = 1) -> WeightMap:
    """``WeightMap`` for a DeepSeek-V3 config; vocab padded to ``divisible_by * tp``."""
    pattern = moe_layer_pattern(hf_config)
    q_rules = Q_LORA_RULES if hf_config.get("q_lora_rank") else Q_DIRECT_RULES
    attention = [INPUT_NORM] + q_rules + KV_RULES + [ATTENTION_OUT]
    moe_rules = attention + moe_mlp_rules(hf_config)
    dense_rules = attention + rows.DENSE_MLP_RULES
    return WeightMap(
        global_rules=rows.output_rules(hf_config),
        layer_rules=lambda layer: moe_rules if pattern[layer] else dense_rules,
        num_layers=hf_config["num_hidden_layers"],
        num_experts=hf_num_experts(hf_config)[1],
        context=rows.context_for(hf_config, divisible_by, tp_size, hf_config["v_head_dim"]),
    )


# ---- fused tensors, tiny variant ----------------------------------------------------------------

_MLA_A_PROJ = ("self_attn.q_a_proj.", "self_attn.kv_a_proj_with_mqa.")


def fused_groups(hf_config: dict) -> tuple:
    """DeepSeek-style MLA: the two down projections are fused when queries are low-rank."""
    return (_MLA_A_PROJ,) if hf_config.get("q_lora_rank") is not None else ()


def tiny_attention_shapes(config: dict, prefix: str) -> dict[str, tuple[int, ...]]:
    """DeepSeek-V3 multi-latent attention: q low-rank path, kv latent + shared rotary key, o."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    qk_dim = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    kv_rank = config["kv_lora_rank"]
    return {
        prefix + "q_a_proj.weight": (config["q_lora_rank"], hidden),
        prefix + "q_a_layernorm.weight": (config["q_lora_rank"],),
        prefix + "q_b_proj.weight": (heads * qk_dim, config["q_lora_rank"]),
        prefix + "kv_a_proj_with_mqa.weight": (kv_rank + config["qk_rope_head_dim"], hidden),
        prefix + "kv_a_layernorm.weight": (kv_rank,),
        prefix + "kv_b_proj.weight": (heads * (config["qk_nope_head_dim"] + config["v_head_dim"]), kv_rank),
        prefix + "o_proj.weight": (hidden, heads * config["v_head_dim"]),
    }


# DeepSeek-V3 keys as released (rope_scaling, n_routed_experts, ...); head_dim is the rotary dim
# as transformers sets it. qk 16+8 and v 16 head dims differ, as in the real model (192 / 128).
TINY = TinyVariant(
    config=MappingProxyType({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_key_value_heads": 4,
        "head_dim": 8,
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1},
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 4,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "aux_loss_alpha": 0.001,
        "ep_size": 1,
        "num_nextn_predict_layers": 0,
    }),
    script="deepseek-v3-tiny.sh",
    recipe_match=lambda a: "--multi-latent-attention" in a,
)

FAMILY = ModelFamily(
    name="deepseek_v3",
    # DeepSeek-V3 / R1, Kimi-K2 and Moonlight all declare DeepseekV3ForCausalLM
    architectures=("DeepseekV3ForCausalLM",),
    megatron_args=megatron_args,
    build_weight_map=build_weight_map,
    fused_groups=fused_groups,
    engine_architectures=("DeepseekV2ForCausalLM",),
    tiny_variants=MappingProxyType({"deepseek_v3": TINY}),
    tiny_attention_shapes=tiny_attention_shapes,
)
