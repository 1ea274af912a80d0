"""What a model family module of `slime.models` declares: `ModelFamily` and its `TinyVariant`s.

A family module (``slime/models/<family>.py``) ends with one ``FAMILY = ModelFamily(...)``; the
registry (`slime.models.registry`) looks families up by the HF ``architectures[0]`` of a
``config.json``. Everything else about the family (its rule tables, special cases) stays inside its
module, reached through these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping


def no_fused_groups(hf_config: dict) -> tuple:
    """The fused groups of a family whose checkpoint tensors SGLang never caches across calls."""
    return ()


@dataclass(frozen=True)
class TinyVariant:
    """A toy-size checkpoint of the family, written by ``tools/make_tiny_model.py --variant NAME``.

    ``config``: the config.json keys of the variant on top of the shared tiny shape
    (``make_tiny_model._COMMON_CONFIG``); ``script``: its MODEL_ARGS under ``scripts/models/``;
    ``recipe_match(model_args) -> bool``: whether a GPU recipe's MODEL_ARGS (a flag list) belong to
    this variant's kind of model, so ``tools/recipe_twin.py`` runs the recipe on it. Exactly one
    variant of all families may match a recipe."""

    config: Mapping
    script: str
    recipe_match: Callable[[list], bool]


@dataclass(frozen=True)
class ModelFamily:
    """One model family: the HF architectures it covers and how to build everything from a config.

    ``megatron_args(hf_config) -> {args dest: value}``: the Megatron-LM model args the config
    implies (argument validation compares a recipe's MODEL_ARGS with it; the converters use it when
    no MODEL_ARGS are given). ``build_weight_map(hf_config, divisible_by, tp_size) -> WeightMap``.
    ``fused_groups(hf_config)``: checkpoint tensors SGLang fuses on load (`slime.models.fused`).
    ``engine_architectures``: further architectures the local engine may serve with the same fused
    groups (no weight map, no training). ``tiny_variants``: variant name -> `TinyVariant`;
    ``tiny_attention_shapes(config, prefix)``: {HF name: shape} of one layer's attention in a tiny
    checkpoint (names under ``prefix``, ``model.layers.N.self_attn.``)."""

    name: str
    architectures: tuple
    megatron_args: Callable[[dict], dict]
    build_weight_map: Callable
    fused_groups: Callable[[dict], tuple] = no_fused_groups
    engine_architectures: tuple = ()
    tiny_variants: Mapping = field(default_factory=lambda: MappingProxyType({}))
    tiny_attention_shapes: Callable[[dict, str], dict] | None = None
