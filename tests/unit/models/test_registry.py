"""slime.models' registry: every family module is found, lookups are exact, names are unique, and
the fused groups and tiny variants are the families' own."""

import pkgutil
from pathlib import Path

import pytest

import slime.models as models
from slime.models import registry
from slime.models.family import ModelFamily


def test_every_family_module_is_registered():
    names = {m.name for m in pkgutil.iter_modules([str(Path(models.__file__).parent)])}
    with_family = {f.name for f in models.FAMILIES}
    assert {"qwen3", "deepseek_v3", "glm4_moe"} <= with_family <= names
    assert set(models.ARCHITECTURES) >= {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM",
                                         "Glm4MoeForCausalLM"}
    for arch, family in models.ARCHITECTURES.items():
        assert models.model_family({"architectures": [arch]}) is family


def test_a_name_two_families_declare_is_refused():
    one = ModelFamily("a", ("XForCausalLM",), dict, None)
    two = ModelFamily("b", ("XForCausalLM",), dict, None)
    with pytest.raises(ValueError, match="'XForCausalLM' is declared by two model families: a and b"):
        registry.index((one, two), lambda f: f.architectures)


def test_fused_groups_are_the_familys():
    mla = {"architectures": ["DeepseekV3ForCausalLM"], "q_lora_rank": 8}
    assert models.fused_groups(mla) == (("self_attn.q_a_proj.", "self_attn.kv_a_proj_with_mqa."),)
    assert models.fused_groups({**mla, "architectures": ["DeepseekV2ForCausalLM"]}) == models.fused_groups(mla)
    assert models.fused_groups({**mla, "q_lora_rank": None}) == ()
    assert models.fused_groups({"architectures": ["Qwen3MoeForCausalLM"]}) == ()
    assert models.fused_groups({}) == ()
    with pytest.raises(ValueError, match="no weight map for architecture 'DeepseekV2ForCausalLM'"):
        models.model_family({"architectures": ["DeepseekV2ForCausalLM"]})  # served, not trained


def test_tiny_variants_and_recipe_matching():
    assert models.tiny_variant_names() == ["deepseek_v3", "dense", "glm4_moe", "moe"]
    family, variant = models.tiny_variant("glm4_moe")
    assert family.name == "glm4_moe" and variant.script == "glm4.5-tiny.sh"
    assert variant.config["architectures"] == ["Glm4MoeForCausalLM"]
    with pytest.raises(ValueError, match="--variant 'llama': expected one of"):
        models.tiny_variant("llama")
    recipes = {
        "moe": ["--num-experts", "128", "--qk-layernorm"],
        "dense": ["--qk-layernorm"],
        "deepseek_v3": ["--multi-latent-attention", "--num-experts", "256"],
        "glm4_moe": ["--add-qkv-bias", "--num-experts", "160"],
    }
    for name, argv in recipes.items():
        assert models.tiny_variant_for_recipe(argv) == name
    with pytest.raises(ValueError, match=r"match tiny variants \[\]"):
        models.tiny_variant_for_recipe(["--add-qkv-bias"])  # a dense model with QKV biases: no family yet
