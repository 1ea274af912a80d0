"""The model families of `slime.models`, looked up by the HF ``architectures[0]`` of a config.json.

Owns `FAMILIES`: the ``FAMILY`` of every module of this package that declares one (a family module;
the shared ones declare none), found once at import in module-name order, so adding a family is
adding its module. And the lookups every user goes through: the family of a config (exact
architecture match; an unknown architecture raises an error listing the supported ones), its
Megatron-LM model args, its ``WeightMap``, the tensors SGLang fuses, and the tiny variants of
``tools/make_tiny_model.py`` and ``tools/recipe_twin.py``.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from slime.models.family import ModelFamily, TinyVariant
from slime.models.weight_map import WeightMap


# Modules that import this one (family modules import only the shared modules, never the registry
# or the package): not imported by the discovery.
_USERS = frozenset({"registry", "check"})


def _discover() -> tuple[ModelFamily, ...]:
    """``FAMILY`` of each module beside this one, in module-name order."""
    families = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if info.name in _USERS:
            continue
        family = getattr(importlib.import_module(f"{__package__}.{info.name}"), "FAMILY", None)
        if family is not None:
            if not isinstance(family, ModelFamily):
                raise TypeError(f"slime.models.{info.name}.FAMILY is a {type(family).__name__}, not a ModelFamily")
            families.append(family)
    return tuple(families)


FAMILIES: tuple[ModelFamily, ...] = _discover()


def index(families, key) -> Mapping[str, ModelFamily]:
    """{name: family} over ``key(family)`` (names) of every family; a name two families declare raises."""
    out: dict[str, ModelFamily] = {}
    for family in families:
        for name in key(family):
            if name in out:
                raise ValueError(f"{name!r} is declared by two model families: {out[name].name} and {family.name}")
            out[name] = family
    return MappingProxyType(out)


# HF architectures[0] -> family (trained: weight map and model args)
ARCHITECTURES = index(FAMILIES, lambda f: f.architectures)
# ... and the architectures the local engine may serve with a family's fused groups
_ENGINE_ARCHITECTURES = index(FAMILIES, lambda f: f.architectures + f.engine_architectures)
# tiny variant name -> family
_TINY = index(FAMILIES, lambda f: tuple(f.tiny_variants))


def _architecture(hf_config: dict):
    return (hf_config.get("architectures") or [None])[0]


def model_family(hf_config: dict) -> ModelFamily:
    """Registry entry for ``hf_config["architectures"][0]``; raises for unsupported models."""
    archs = hf_config.get("architectures") or []
    if not archs:
        raise ValueError("HF config.json has no 'architectures' entry; cannot pick a weight map")
    if archs[0] not in ARCHITECTURES:
        raise ValueError(
            f"no weight map for architecture {archs[0]!r}; supported: {sorted(ARCHITECTURES)}"
        )
    return ARCHITECTURES[archs[0]]


def family_args(hf_config: dict) -> dict | None:
    """The family's Megatron-LM args of ``hf_config``; None for an architecture not listed. Raises
    ValueError for a config the family cannot express in megatron (e.g. MLA with biases)."""
    family = ARCHITECTURES.get(_architecture(hf_config))
    return family.megatron_args(hf_config) if family else None


def weight_map_for(hf_config: dict, divisible_by: int = 128, tp_size: int = 1) -> WeightMap:
    """``WeightMap`` for an HF config (vocab padded to ``divisible_by * tp_size``)."""
    return model_family(hf_config).build_weight_map(hf_config, divisible_by, tp_size)


def fused_groups(hf_config: dict) -> tuple:
    """The fused groups of `hf_config` (empty for architectures SGLang fuses nothing of)."""
    family = _ENGINE_ARCHITECTURES.get(_architecture(hf_config))
    return tuple(family.fused_groups(hf_config)) if family else ()


def tiny_variant(name: str) -> tuple[ModelFamily, TinyVariant]:
    """(family, variant) of the tiny variant ``name``; raises naming the known ones."""
    if name not in _TINY:
        raise ValueError(f"--variant {name!r}: expected one of {sorted(_TINY)}")
    family = _TINY[name]
    return family, family.tiny_variants[name]


def tiny_variant_names() -> list[str]:
    """Every tiny variant name, sorted."""
    return sorted(_TINY)


def tiny_variant_for_recipe(model_args: list) -> str:
    """The tiny variant whose ``recipe_match`` accepts a recipe's MODEL_ARGS (a flag list); raises
    when none or more than one does."""
    hits = [name for name in sorted(_TINY) if _TINY[name].tiny_variants[name].recipe_match(model_args)]
    if len(hits) != 1:
        raise ValueError(f"the recipe's MODEL_ARGS match tiny variants {hits}; exactly one must match "
                         "(TinyVariant.recipe_match of the families in slime.models)")
    return hits[0]
