"""HF <-> Megatron weight maps, looked up by the HF ``architectures[0]``.

Owns the registry ``WEIGHT_MAPS``: architecture name -> ``ModelFamily`` (how to build
the ``WeightMap`` for a config and the Megatron-LM model args it implies). Lookups
are exact: an unknown architecture raises an error listing the supported ones.
"""

from dataclasses import dataclass
from typing import Callable

from slime.backends.megatron_utils.weight_maps import deepseek_v3, glm4_moe, qwen3
from slime.utils.arguments import hf_families
from slime.backends.megatron_utils.weight_maps.base import (
    MegatronLayout,
    ShardContext,
    WeightMap,
    gather_tensor,
    global_name,
    local_name,
    shard_tensor,
)


@dataclass(frozen=True)
class ModelFamily:
    """``build_weight_map(hf_config, divisible_by, tp_size)`` and ``megatron_args(hf_config)`` (the
    family's entry of `slime.utils.arguments.hf_families.FAMILY_ARGS`, which validation reads too)."""

    build_weight_map: Callable[..., WeightMap]
    megatron_args: Callable[[dict], dict]


WEIGHT_MAPS = {
    "Qwen3ForCausalLM": ModelFamily(qwen3.build_weight_map, hf_families.qwen3_args),
    "Qwen3MoeForCausalLM": ModelFamily(qwen3.build_weight_map, hf_families.qwen3_args),
    # DeepSeek-V3 / R1, Kimi-K2 and Moonlight all declare DeepseekV3ForCausalLM
    "DeepseekV3ForCausalLM": ModelFamily(deepseek_v3.build_weight_map, hf_families.deepseek_v3_args),
    # GLM-4.5, GLM-4.5-Air, GLM-4.6 and GLM-4.7
    "Glm4MoeForCausalLM": ModelFamily(glm4_moe.build_weight_map, hf_families.glm4_moe_args),
}


def model_family(hf_config: dict) -> ModelFamily:
    """Registry entry for ``hf_config["architectures"][0]``; raises for unsupported models."""
    archs = hf_config.get("architectures") or []
    if not archs:
        raise ValueError("HF config.json has no 'architectures' entry; cannot pick a weight map")
    if archs[0] not in WEIGHT_MAPS:
        raise ValueError(
            f"no weight map for architecture {archs[0]!r}; supported: {sorted(WEIGHT_MAPS)}"
        )
    return WEIGHT_MAPS[archs[0]]


def weight_map_for(hf_config: dict, divisible_by: int = 128, tp_size: int = 1) -> WeightMap:
    """``WeightMap`` for an HF config (vocab padded to ``divisible_by * tp_size``)."""
    return model_family(hf_config).build_weight_map(hf_config, divisible_by, tp_size)


__all__ = [
    "WEIGHT_MAPS",
    "MegatronLayout",
    "ModelFamily",
    "ShardContext",
    "WeightMap",
    "gather_tensor",
    "global_name",
    "local_name",
    "model_family",
    "shard_tensor",
    "weight_map_for",
]
