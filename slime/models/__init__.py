"""Model families: one module per family, a registry, and the shared rule machinery beside them.

A family module (``qwen3``, ``deepseek_v3``, ``glm4_moe``) holds everything that makes the family:
the Megatron-LM model args of an HF ``config.json``, the HF <-> Megatron weight rules, the tensors
SGLang fuses, special cases and its tiny variant; it ends with one ``FAMILY = ModelFamily(...)``
(`slime.models.family`). `slime.models.registry` looks families up by the HF ``architectures[0]``;
`check` compares a recipe's MODEL_ARGS with a config (`validate_hf_checkpoint` is the parse-time
step the entry points hand to `slime.utils.arguments.parse_args`). Shared machinery: `hf_args` (the
HF key -> flag table), `weight_map` (``Rule``, ``WeightMap``, sharding), `transforms` (tensor
transforms), `common_rules` (HF's standard layout rows), `fused`, `tiny`.

Free of torch at import: argument parsing imports this package (torch is imported inside the
functions that move tensors).
"""

from slime.models.check import check_hf_config, validate_hf_checkpoint
from slime.models.registry import (
    ARCHITECTURES,
    FAMILIES,
    family_args,
    fused_groups,
    model_family,
    tiny_variant,
    tiny_variant_for_recipe,
    tiny_variant_names,
    weight_map_for,
)

__all__ = [
    "ARCHITECTURES",
    "FAMILIES",
    "check_hf_config",
    "family_args",
    "fused_groups",
    "model_family",
    "tiny_variant",
    "tiny_variant_for_recipe",
    "tiny_variant_names",
    "validate_hf_checkpoint",
    "weight_map_for",
]
