"""Cross-check of MODEL_ARGS (Megatron-LM model-shape flags) against a Hugging Face config.json.

Pure functions, shared by argument validation, the weight maps (`hf_shape_args`) and the checkpoint
converters.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable

_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
# (flag, args dest, HF config keys tried in order). The first HF key present is compared.
_INT_FIELDS = (
    ("--num-layers", "num_layers", ("num_hidden_layers",)),
    ("--hidden-size", "hidden_size", ("hidden_size",)),
    ("--num-attention-heads", "num_attention_heads", ("num_attention_heads",)),
    ("--ffn-hidden-size", "ffn_hidden_size", ("intermediate_size",)),
    ("--kv-channels", "kv_channels", ("head_dim",)),
    ("--num-experts", "num_experts", _EXPERT_KEYS),
    ("--moe-router-topk", "moe_router_topk", ("num_experts_per_tok",)),
    ("--moe-ffn-hidden-size", "moe_ffn_hidden_size", ("moe_intermediate_size",)),
)
# Multi-latent attention (DeepSeek-V3 family): compared with --multi-latent-attention only, and
# then --kv-channels is not (MLA has no single head dim; HF's head_dim is the rotary dim).
_MLA_FIELDS = (
    ("--q-lora-rank", "q_lora_rank", ("q_lora_rank",)),
    ("--kv-lora-rank", "kv_lora_rank", ("kv_lora_rank",)),
    ("--qk-head-dim", "qk_head_dim", ("qk_nope_head_dim",)),
    ("--qk-pos-emb-head-dim", "qk_pos_emb_head_dim", ("qk_rope_head_dim",)),
    ("--v-head-dim", "v_head_dim", ("v_head_dim",)),
)
_FLOAT_FIELDS = (
    ("--norm-epsilon", "norm_epsilon", ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")),
)


_MOE_ONLY = ("moe_router_topk", "moe_ffn_hidden_size")
# dests `check_hf_config` compares itself (the family comparison skips them)
_COMPARED_ABOVE = frozenset(dest for _f, dest, _k in _INT_FIELDS + _MLA_FIELDS + _FLOAT_FIELDS) | {
    "num_query_groups", "rotary_base", "untie_embeddings_and_output_weights"}


def _hf_value(hf_config: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for key in keys:
        if hf_config.get(key) is not None:
            return key, hf_config[key]
    return None, None


def hf_shape_args(hf_config: dict) -> dict[str, Any]:
    """{args dest: value} of every model-shape field in the tables above that ``hf_config`` has
    (the first HF key present; MoE-only fields only for an MoE config; the multi-latent attention
    dims, instead of --kv-channels, for a config with ``kv_lora_rank``). The one HF key -> Megatron
    flag mapping: `check_hf_config` compares through the same tables, and each weight map's
    ``megatron_args`` starts from this dict and adds what its family implies."""
    out: dict[str, Any] = {}
    moe = bool(hf_num_experts(hf_config)[1])
    for _flag, dest, keys in _INT_FIELDS:
        value = _hf_value(hf_config, keys)[1]
        if value is not None and (moe or dest not in _MOE_ONLY) and (dest != "num_experts" or moe):
            out[dest] = int(value)
    if hf_config.get("kv_lora_rank") is not None:  # multi-latent attention: no single head dim
        out.pop("kv_channels", None)
        for _flag, dest, keys in _MLA_FIELDS:
            value = _hf_value(hf_config, keys)[1]
            if value is not None:
                out[dest] = int(value)
    for _flag, dest, keys in _FLOAT_FIELDS:
        value = _hf_value(hf_config, keys)[1]
        if value is not None:
            out[dest] = float(value)
    return out


def hf_num_experts(hf_config: dict) -> tuple[str | None, int]:
    """(key, routed expert count) of an HF config; (None, 0) for a dense model. The one reading of
    the expert count, shared with the weight maps' HF -> Megatron args."""
    key, value = _hf_value(hf_config, _EXPERT_KEYS)
    return (key, int(value)) if value else (None, 0)


def hf_rope_theta(hf_config: dict) -> tuple[str | None, Any]:
    """(key, rope theta) from the top level or `rope_parameters` / `rope_scaling`; (None, None)."""
    return _rope_theta(hf_config)


def _rope_theta(hf_config: dict) -> tuple[str | None, Any]:
    if hf_config.get("rope_theta") is not None:
        return "rope_theta", hf_config["rope_theta"]
    for key in ("rope_parameters", "rope_scaling"):
        nested = hf_config.get(key)
        if isinstance(nested, dict) and nested.get("rope_theta") is not None:
            return f"{key}.rope_theta", nested["rope_theta"]
    return None, None


def _compare(out: list[str], flag: str, ours: Any, key: str | None, theirs: Any,
             same: Callable[[Any, Any], bool]) -> None:
    if ours is None or key is None:
        return
    if not same(ours, theirs):
        out.append(f"{flag} {ours} does not match HF config {key}={theirs}")


def _is_moe(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "num_experts", None))


def check_hf_config(args: argparse.Namespace, hf_config: dict) -> list[str]:
    """Compare model-shape flags in ``args`` with an HF ``config.json`` dict.

    Checks layers, hidden size, heads, query groups, FFN size, head dim, experts, router top-k,
    MoE FFN size, norm epsilon, rope base and tied embeddings; with --multi-latent-attention the
    MLA ranks and head dims instead of the head dim. A flag left at None or a key absent
    from the config is not compared by these tables. Then, for an architecture of
    `hf_families.FAMILY_ARGS`, every other field that shapes the model is compared with what the
    family implies (`hf_families.check_family_args`: routed scaling, expert groups, first-k-dense
    layers, shared experts, partial rotary, QK norm, biases, vocabulary, positions, YaRN, ...).
    Returns one message per mismatch, each naming the flag, our value and the HF value; an empty
    list means they agree.
    """
    out: list[str] = []
    mla = bool(getattr(args, "multi_latent_attention", False))
    for flag, dest, keys in _INT_FIELDS + (_MLA_FIELDS if mla else ()):
        if (dest in _MOE_ONLY and not _is_moe(args)) or (mla and dest == "kv_channels"):
            continue
        key, theirs = _hf_value(hf_config, keys)
        _compare(out, flag, getattr(args, dest, None), key, theirs, lambda a, b: int(a) == int(b))
    for flag, dest, keys in _FLOAT_FIELDS:
        key, theirs = _hf_value(hf_config, keys)
        _compare(out, flag, getattr(args, dest, None), key, theirs,
                 lambda a, b: math.isclose(float(a), float(b), rel_tol=1e-6))
    _check_query_groups(out, args, hf_config)
    key, experts = _hf_value(hf_config, _EXPERT_KEYS)
    if experts and not _is_moe(args):
        out.append(f"--num-experts is not set (dense model) but HF config {key}={experts}")
    if getattr(args, "position_embedding_type", None) == "rope":
        key, theirs = _rope_theta(hf_config)
        _compare(out, "--rotary-base", getattr(args, "rotary_base", None), key, theirs,
                 lambda a, b: math.isclose(float(a), float(b), rel_tol=1e-6))
    _check_model_name(out, args, hf_config)
    if "tie_word_embeddings" in hf_config and hasattr(args, "untie_embeddings_and_output_weights"):
        untied = bool(args.untie_embeddings_and_output_weights)
        if untied == bool(hf_config["tie_word_embeddings"]):
            out.append(f"--untie-embeddings-and-output-weights is {'set' if untied else 'not set'} but HF "
                       f"config tie_word_embeddings={hf_config['tie_word_embeddings']}")
    from slime.utils.arguments.hf_families import check_family_args  # it imports this module

    return out + check_family_args(args, hf_config, _COMPARED_ABOVE)


def _check_query_groups(out: list[str], args: argparse.Namespace, hf_config: dict) -> None:
    heads = getattr(args, "num_attention_heads", None)
    kv_heads = hf_config.get("num_key_value_heads")
    if heads is None or kv_heads is None:
        return
    if getattr(args, "group_query_attention", False):
        _compare(out, "--num-query-groups", args.num_query_groups, "num_key_value_heads", kv_heads,
                 lambda a, b: int(a) == int(b))
    elif int(kv_heads) != int(heads):
        out.append(f"--group-query-attention is not set (query groups = --num-attention-heads {heads}) but HF "
                   f"config num_key_value_heads={kv_heads}")


def _check_model_name(out: list[str], args: argparse.Namespace, hf_config: dict) -> None:
    """--model-name (slime's converter choice) must name the family of the checkpoint's architecture,
    from which this trainer picks the converter."""
    from slime.utils.arguments.features import model_family_name

    name, archs = getattr(args, "model_name", None), hf_config.get("architectures") or []
    if name is None or not archs:
        return
    if model_family_name(name) != model_family_name(archs[0]):
        out.append(f"--model-name {name} names another model family than HF config architectures={archs[0]} "
                   f"({model_family_name(archs[0])}; the weight converter follows the architecture)")
