"""The shared HF ``config.json`` -> Megatron-LM model args table, and the helpers family modules share.

Owns the one HF key -> Megatron flag mapping of the model-shape fields every family has (layers,
hidden size, heads, FFN sizes, head dim, experts, router top-k, multi-latent attention dims, norm
epsilon: `hf_shape_args`), the reading of the expert count and the rotary parameters, and
`common_args`: what every family in `slime.models` has (RMSNorm, RoPE, SwiGLU, no linear biases,
vocabulary, positions, (un)tied output). Each family module's ``megatron_args(hf_config)`` starts
from `common_args` and adds what the family implies; `slime.models.check` compares a recipe's
MODEL_ARGS with both. Pure functions of the config dict.
"""

from __future__ import annotations

from typing import Any

EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
# (flag, args dest, HF config keys tried in order). The first HF key present is compared.
INT_FIELDS = (
    ("--num-layers", "num_layers", ("num_hidden_layers",)),
    ("--hidden-size", "hidden_size", ("hidden_size",)),
    ("--num-attention-heads", "num_attention_heads", ("num_attention_heads",)),
    ("--ffn-hidden-size", "ffn_hidden_size", ("intermediate_size",)),
    ("--kv-channels", "kv_channels", ("head_dim",)),
    ("--num-experts", "num_experts", EXPERT_KEYS),
    ("--moe-router-topk", "moe_router_topk", ("num_experts_per_tok",)),
    ("--moe-ffn-hidden-size", "moe_ffn_hidden_size", ("moe_intermediate_size",)),
)
# Multi-latent attention (DeepSeek-V3 family): compared with --multi-latent-attention only, and
# then --kv-channels is not (MLA has no single head dim; HF's head_dim is the rotary dim).
MLA_FIELDS = (
    ("--q-lora-rank", "q_lora_rank", ("q_lora_rank",)),
    ("--kv-lora-rank", "kv_lora_rank", ("kv_lora_rank",)),
    ("--qk-head-dim", "qk_head_dim", ("qk_nope_head_dim",)),
    ("--qk-pos-emb-head-dim", "qk_pos_emb_head_dim", ("qk_rope_head_dim",)),
    ("--v-head-dim", "v_head_dim", ("v_head_dim",)),
)
FLOAT_FIELDS = (
    ("--norm-epsilon", "norm_epsilon", ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")),
)
MOE_ONLY = ("moe_router_topk", "moe_ffn_hidden_size")


def hf_value(hf_config: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    """(key, value) of the first of ``keys`` that ``hf_config`` sets (not None); (None, None)."""
    for key in keys:
        if hf_config.get(key) is not None:
            return key, hf_config[key]
    return None, None


def hf_shape_args(hf_config: dict) -> dict[str, Any]:
    """{args dest: value} of every model-shape field in the tables above that ``hf_config`` has
    (the first HF key present; MoE-only fields only for an MoE config; the multi-latent attention
    dims, instead of --kv-channels, for a config with ``kv_lora_rank``). The one HF key -> Megatron
    flag mapping: `slime.models.check.check_hf_config` compares through the same tables, and each
    family's ``megatron_args`` starts from this dict and adds what its family implies."""
    out: dict[str, Any] = {}
    moe = bool(hf_num_experts(hf_config)[1])
    for _flag, dest, keys in INT_FIELDS:
        value = hf_value(hf_config, keys)[1]
        if value is not None and (moe or dest not in MOE_ONLY) and (dest != "num_experts" or moe):
            out[dest] = int(value)
    if hf_config.get("kv_lora_rank") is not None:  # multi-latent attention: no single head dim
        out.pop("kv_channels", None)
        for _flag, dest, keys in MLA_FIELDS:
            value = hf_value(hf_config, keys)[1]
            if value is not None:
                out[dest] = int(value)
    for _flag, dest, keys in FLOAT_FIELDS:
        value = hf_value(hf_config, keys)[1]
        if value is not None:
            out[dest] = float(value)
    return out


def hf_num_experts(hf_config: dict) -> tuple[str | None, int]:
    """(key, routed expert count) of an HF config; (None, 0) for a dense model. The one reading of
    the expert count, shared with the weight maps' HF -> Megatron args."""
    key, value = hf_value(hf_config, EXPERT_KEYS)
    return (key, int(value)) if value else (None, 0)


def hf_rope_theta(hf_config: dict) -> tuple[str | None, Any]:
    """(key, rope theta) from the top level or `rope_parameters` / `rope_scaling`; (None, None)."""
    if hf_config.get("rope_theta") is not None:
        return "rope_theta", hf_config["rope_theta"]
    for key in ("rope_parameters", "rope_scaling"):
        nested = hf_config.get(key)
        if isinstance(nested, dict) and nested.get("rope_theta") is not None:
            return f"{key}.rope_theta", nested["rope_theta"]
    return None, None


def rope_theta(hf_config: dict) -> float:
    """``rope_theta`` from the top level or ``rope_parameters`` / ``rope_scaling`` (default 10000)."""
    value = hf_rope_theta(hf_config)[1]
    return float(value) if value is not None else 10000.0


def head_dim(hf_config: dict) -> int:
    """Per-head dim (``head_dim`` or hidden / heads)."""
    return int(hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"])


def rope_scaling(hf_config: dict) -> dict:
    """The rotary parameters dict (``rope_scaling`` as released, ``rope_parameters`` as
    transformers 5 writes it); empty when absent."""
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(hf_config.get(key), dict):
            return hf_config[key]
    return {}


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


def common_args(hf_config: dict, norm_eps: float) -> dict:
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
