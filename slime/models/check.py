"""Cross-check of MODEL_ARGS (Megatron-LM model-shape flags) against a Hugging Face config.json.

Owns `check_hf_config` (the shared key table of `slime.models.hf_args`, query groups, rope base,
tied embeddings, --model-name, then every field the config's family implies: `check_family_args`)
and `validate_hf_checkpoint`, the parse-time step that reads --hf-checkpoint's config.json: the
entry points hand it to `slime.utils.arguments.parse_args` (``model_check``), since argument
parsing sits below `slime.models`. Pure functions, shared by argument validation and the checkpoint
converters.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Callable

from slime.models.hf_args import EXPERT_KEYS, FLOAT_FIELDS, INT_FIELDS, MLA_FIELDS, MOE_ONLY, hf_rope_theta, hf_value
from slime.models.registry import family_args
from slime.utils.arguments.common import ArgumentError
from slime.utils.arguments.features import model_family_name
from slime.utils.arguments.moe_layer_freq import parse_moe_layer_freq

# dests `check_hf_config` compares itself (the family comparison skips them)
_COMPARED_ABOVE = frozenset(dest for _f, dest, _k in INT_FIELDS + MLA_FIELDS + FLOAT_FIELDS) | {
    "num_query_groups", "rotary_base", "untie_embeddings_and_output_weights"}


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
    `slime.models.registry`, every other field that shapes the model is compared with what the
    family implies (`check_family_args`: routed scaling, expert groups, first-k-dense
    layers, shared experts, partial rotary, QK norm, biases, vocabulary, positions, YaRN, ...).
    Returns one message per mismatch, each naming the flag, our value and the HF value; an empty
    list means they agree.
    """
    out: list[str] = []
    mla = bool(getattr(args, "multi_latent_attention", False))
    for flag, dest, keys in INT_FIELDS + (MLA_FIELDS if mla else ()):
        if (dest in MOE_ONLY and not _is_moe(args)) or (mla and dest == "kv_channels"):
            continue
        key, theirs = hf_value(hf_config, keys)
        _compare(out, flag, getattr(args, dest, None), key, theirs, lambda a, b: int(a) == int(b))
    for flag, dest, keys in FLOAT_FIELDS:
        key, theirs = hf_value(hf_config, keys)
        _compare(out, flag, getattr(args, dest, None), key, theirs,
                 lambda a, b: math.isclose(float(a), float(b), rel_tol=1e-6))
    _check_query_groups(out, args, hf_config)
    key, experts = hf_value(hf_config, EXPERT_KEYS)
    if experts and not _is_moe(args):
        out.append(f"--num-experts is not set (dense model) but HF config {key}={experts}")
    if getattr(args, "position_embedding_type", None) == "rope":
        key, theirs = hf_rope_theta(hf_config)
        _compare(out, "--rotary-base", getattr(args, "rotary_base", None), key, theirs,
                 lambda a, b: math.isclose(float(a), float(b), rel_tol=1e-6))
    _check_model_name(out, args, hf_config)
    if "tie_word_embeddings" in hf_config and hasattr(args, "untie_embeddings_and_output_weights"):
        untied = bool(args.untie_embeddings_and_output_weights)
        if untied == bool(hf_config["tie_word_embeddings"]):
            out.append(f"--untie-embeddings-and-output-weights is {'set' if untied else 'not set'} but HF "
                       f"config tie_word_embeddings={hf_config['tie_word_embeddings']}")
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
    name, archs = getattr(args, "model_name", None), hf_config.get("architectures") or []
    if name is None or not archs:
        return
    if model_family_name(name) != model_family_name(archs[0]):
        out.append(f"--model-name {name} names another model family than HF config architectures={archs[0]} "
                   f"({model_family_name(archs[0])}; the weight converter follows the architecture)")


# ---- every field the family implies -------------------------------------------------------------

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
    implies (``ModelFamily.megatron_args``; routing, scaling, groups, first-k-dense layers, shared
    experts, rotary fraction and type, YaRN, QK norm, biases, norms, vocabulary, positions), each
    naming the flag and both values. Dests in `skip` (compared elsewhere), training choices and
    args the parser does not have are left out; an architecture not in the registry, or a config
    without a key the family reads (a partial config, not a released one), gives no message."""
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


# ---- the parse-time step --------------------------------------------------------------------------

def validate_hf_checkpoint(args: argparse.Namespace) -> list[str]:
    """--hf-checkpoint's config.json, when present, must agree with MODEL_ARGS (`check_hf_config`);
    raises ArgumentError listing every mismatch. Nothing to do without --hf-checkpoint or without a
    config.json in it (the rollout domain's validation warns about those). Returns the warnings
    (none); the entry points pass it to `parse_args` as ``model_check``."""
    if getattr(args, "hf_checkpoint", None) is None:
        return []
    config_path = os.path.join(args.hf_checkpoint, "config.json")
    if not os.path.isfile(config_path):
        return []
    with open(config_path, encoding="utf-8") as handle:
        hf_config = json.load(handle)
    mismatches = check_hf_config(args, hf_config)
    if mismatches:
        raise ArgumentError(f"MODEL_ARGS disagree with {config_path}: " + "; ".join(mismatches))
    return []
