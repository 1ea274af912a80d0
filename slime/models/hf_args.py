"""Megatron-LM model args implied by a Hugging Face ``config.json``, per model family.

Owns the registry `FAMILY_ARGS`: HF ``architectures[0]`` -> function(hf_config) -> {args dest:
value}, the one HF -> Megatron mapping of every field that shapes the model. It starts from the
shared key table (`hf_config.hf_shape_args`) and adds what each family implies (router, rotary,
norms, biases, YaRN, dense first layers). Pure functions of the config dict: argument validation
(`hf_config.check_hf_config`) compares a recipe's MODEL_ARGS with it, and the weight maps
(`slime.backends.megatron_utils.weight_maps`) build their models and converters from it.
"""

from __future__ import annotations

import math
from typing import Callable

from slime.utils.arguments.hf_config import hf_num_experts, hf_rope_theta, hf_shape_args


# ---- Qwen3 / Qwen3-MoE --------------------------------------------------------------------------

def qwen3_moe_layer_pattern(hf_config: dict) -> list:
    """0/1 per layer: 1 where Qwen3-MoE puts a sparse MLP (``decoder_sparse_step``, ``mlp_only_layers``)."""
    layers = hf_config["num_hidden_layers"]
    if not hf_num_experts(hf_config)[1]:
        return [0] * layers
    step = hf_config.get("decoder_sparse_step", 1) or 1
    dense = set(hf_config.get("mlp_only_layers") or [])
    return [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]


def rope_theta(hf_config: dict) -> float:
    """``rope_theta`` from the top level or ``rope_parameters`` / ``rope_scaling`` (default 10000)."""
    value = hf_rope_theta(hf_config)[1]
    return float(value) if value is not None else 10000.0


def head_dim(hf_config: dict) -> int:
    """Per-head dim (``head_dim`` or hidden / heads)."""
    return int(hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"])


def _common_args(hf_config: dict, norm_eps: float) -> dict:
    """The shared key table plus what every supported family has: RMSNorm, RoPE, SwiGLU, no linear
    biases, vocabulary, positions and (un)tied output."""
    out = hf_shape_args(hf_config)
    out.setdefault("norm_epsilon", norm_eps)
    out.update(
        normalization="RMSNorm",
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
        swiglu=True,
        add_bias_linear=False,
        untie_embeddings_and_output_weights=not hf_config.get("tie_word_embeddings", False),
        vocab_size=hf_config["vocab_size"],
        max_position_embeddings=hf_config.get("max_position_embeddings", 4096),
    )
    return out


def qwen3_args(hf_config: dict) -> dict:
    """Qwen3 dense and MoE: GQA with per-head QK norms, full rotary, softmax router."""
    out = _common_args(hf_config, 1e-6)
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
            moe_layer_freq=qwen3_moe_layer_pattern(hf_config),
            moe_router_score_function="softmax",
            moe_router_pre_softmax=not hf_config.get("norm_topk_prob", False),
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=hf_config.get("router_aux_loss_coef", 0.0),
        )
    return out


# ---- DeepSeek-V3 (DeepSeek-V3/R1, Kimi-K2, Moonlight) ------------------------------------------

def dense_first_layer_pattern(hf_config: dict) -> list:
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
        moe_layer_freq=dense_first_layer_pattern(hf_config),
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


def deepseek_v3_args(hf_config: dict) -> dict:
    """Multi-latent attention (MLA dims from `hf_shape_args`), the sigmoid router, YaRN."""
    out = _common_args(hf_config, 1e-6)
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


# ---- GLM-4.5 / GLM-4.5-Air / GLM-4.6 / GLM-4.7 -----------------------------------------------------

def partial_rotary_factor(hf_config: dict) -> float:
    """Fraction of each head that is rotated (top level or inside ``rope_parameters``; GLM-4.5: 0.5)."""
    value = hf_config.get("partial_rotary_factor")
    if value is None:
        value = rope_scaling(hf_config).get("partial_rotary_factor", 1.0)
    return float(value)


def glm4_moe_args(hf_config: dict) -> dict:
    """GQA with QKV biases and optional QK norms, partial rotary, the DeepSeek-style router."""
    out = _common_args(hf_config, 1e-5)
    out.update(
        group_query_attention=True,
        num_query_groups=hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"],
        kv_channels=head_dim(hf_config),
        rotary_percent=partial_rotary_factor(hf_config),
        add_qkv_bias=bool(hf_config.get("attention_bias", False)),
        qk_layernorm=bool(hf_config.get("use_qk_norm", False)),
    )
    out.update(sigmoid_router_args(hf_config))
    return out


FAMILY_ARGS: dict[str, Callable[[dict], dict]] = {
    "Qwen3ForCausalLM": qwen3_args,
    "Qwen3MoeForCausalLM": qwen3_args,
    # DeepSeek-V3 / R1, Kimi-K2 and Moonlight all declare DeepseekV3ForCausalLM
    "DeepseekV3ForCausalLM": deepseek_v3_args,
    # GLM-4.5, GLM-4.5-Air, GLM-4.6 and GLM-4.7
    "Glm4MoeForCausalLM": glm4_moe_args,
}


def family_args(hf_config: dict) -> dict | None:
    """`FAMILY_ARGS` of ``hf_config``'s architecture; None for an architecture not listed. Raises
    ValueError for a config the family cannot express in megatron (e.g. MLA with biases)."""
    archs = hf_config.get("architectures") or [None]
    rule = FAMILY_ARGS.get(archs[0])
    return rule(hf_config) if rule else None


# ---- validation: a recipe's MODEL_ARGS against the family's args ----------------------------------

# Training choices the family table also sets (for converters that have no recipe): not compared.
_TRAINING_CHOICES = frozenset({"moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_router_bias_update_rate"})
# Compared only when the recipe sets them (None: taken from the tokenizer / the sequence length).
_COMPARED_WHEN_SET = frozenset({"vocab_size", "max_position_embeddings"})
# What megatron does with a flag left unset (None).
_UNSET_MEANS = {"moe_router_topk_scaling_factor": 1.0, "moe_router_num_groups": 1, "moe_router_group_topk": 1}
# Flags spelled otherwise than "--" + dest.
_FLAG_NAMES = {"add_bias_linear": "--disable-bias-linear (add_bias_linear)",
               "untie_embeddings_and_output_weights": "--untie-embeddings-and-output-weights"}


def _ours(args, dest: str):
    """The recipe's value of `dest`, normalised as megatron reads it."""
    value = getattr(args, dest)
    if value is None and dest in _UNSET_MEANS:
        return _UNSET_MEANS[dest]
    if dest == "moe_layer_freq" and value is not None:
        from slime.utils.arguments.moe_layer_freq import parse_moe_layer_freq

        value = parse_moe_layer_freq(value) if isinstance(value, str) else value
        if isinstance(value, int):  # every value-th layer is MoE
            value = [int(i % value == 0) for i in range(int(args.num_layers))]
    if dest == "rope_type" and value is None:  # resolved by megatron's validation
        value = "yarn" if float(getattr(args, "rotary_scaling_factor", 1.0) or 1.0) != 1.0 else "rope"
    return value


def _same(ours, theirs) -> bool:
    if isinstance(theirs, bool) or isinstance(ours, bool):
        return bool(ours) == bool(theirs)
    if isinstance(theirs, float) and ours is not None:
        return math.isclose(float(ours), theirs, rel_tol=1e-6)
    return ours == theirs


def check_family_args(args, hf_config: dict, skip: frozenset = frozenset()) -> list[str]:
    """One message per model-shaping arg of `args` that differs from what ``hf_config``'s family
    implies (`FAMILY_ARGS`; routing, scaling, groups, first-k-dense layers, shared experts, rotary
    fraction and type, YaRN, QK norm, biases, norms, vocabulary, positions), each naming the flag
    and both values. Dests in `skip` (compared elsewhere), training choices and args the parser
    does not have are left out; an architecture not in `FAMILY_ARGS`, or a config without a key the
    family reads (a partial config, not a released one), gives no message."""
    try:
        expected = family_args(hf_config)
    except ValueError as exc:
        return [f"HF config cannot be built by megatron: {exc}"]
    except KeyError:
        return []
    out = []
    for dest, theirs in (expected or {}).items():
        if dest in skip or dest in _TRAINING_CHOICES or not hasattr(args, dest):
            continue
        if dest == "moe_layer_freq" and len(theirs) != getattr(args, "num_layers", None):
            continue  # a --num-layers mismatch, reported by `check_hf_config`
        ours = _ours(args, dest)
        if ours is None and dest in _COMPARED_WHEN_SET:
            continue
        if not _same(ours, theirs):
            flag = _FLAG_NAMES.get(dest, "--" + dest.replace("_", "-"))
            out.append(f"{flag} {ours!r} does not match {theirs!r} implied by the HF config")
    return out
