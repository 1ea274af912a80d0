"""scripts/models/qwen3-tiny*.sh: every Megatron flag agrees with the config.json the tool writes."""

import json
import subprocess

import pytest

from slime.models import tiny_variant, tiny_variant_names
from slime.utils.arguments.moe_layer_freq import parse_moe_layer_freq
from tests.conftest import load_tool


def model_args(repo_root, script: str) -> dict:
    """Source a model script in bash and return MODEL_ARGS as {flag: value or True}."""
    out = subprocess.run(
        ["bash", "-c", f'source "{repo_root}/scripts/models/{script}" && printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    flags, i = {}, 0
    while i < len(out):
        assert out[i].startswith("--"), f"{script}: stray value {out[i]!r}"
        takes_value = i + 1 < len(out) and not out[i + 1].startswith("--")
        assert out[i] not in flags, f"{script}: {out[i]} given twice"
        flags[out[i]] = out[i + 1] if takes_value else True
        i += 2 if takes_value else 1
    return flags


# Flag -> (config.json key, converter from the flag's string) shared by both variants.
COMMON = {
    "--num-layers": ("num_hidden_layers", int),
    "--hidden-size": ("hidden_size", int),
    "--ffn-hidden-size": ("intermediate_size", int),
    "--num-attention-heads": ("num_attention_heads", int),
    "--num-query-groups": ("num_key_value_heads", int),
    "--kv-channels": ("head_dim", int),
    "--norm-epsilon": ("rms_norm_eps", float),
    "--rotary-base": ("rope_theta", float),
    "--vocab-size": ("vocab_size", int),
}
MOE = {
    "--num-experts": ("num_experts", int),
    "--moe-ffn-hidden-size": ("moe_intermediate_size", int),
    "--moe-router-topk": ("num_experts_per_tok", int),
}
# Flags whose value follows from the Qwen3 architecture itself, not from a config number.
FIXED = {
    "--disable-bias-linear": True, "--qk-layernorm": True, "--group-query-attention": True,
    "--swiglu": True, "--untie-embeddings-and-output-weights": True, "--normalization": "RMSNorm",
    "--position-embedding-type": "rope", "--rotary-percent": "1.0", "--transformer-impl": "local",
}
FIXED_MOE = {
    "--moe-router-score-function": "softmax", "--moe-token-dispatcher-type": "allgather",
    "--moe-router-dtype": "fp32", "--moe-aux-loss-coeff": "0",
}


@pytest.mark.parametrize("script, fixture, table, fixed", [
    ("qwen3-tiny-moe.sh", "tiny_moe_hf", {**COMMON, **MOE}, {**FIXED, **FIXED_MOE}),
    ("qwen3-tiny.sh", "tiny_dense_hf", COMMON, FIXED),
])
def test_model_args_match_config(request, repo_root, script, fixture, table, fixed):
    config = json.loads((request.getfixturevalue(fixture) / "config.json").read_text())
    flags = model_args(repo_root, script)
    for flag, (key, cast) in table.items():
        assert cast(flags[flag]) == config[key], f"{script}: {flag} {flags[flag]} != config {key} {config[key]}"
    assert {f: flags.get(f) for f in fixed} == fixed
    assert config["hidden_act"] == "silu" and not config["attention_bias"] and not config["tie_word_embeddings"]
    expected = set(table) | set(fixed) | ({"--moe-layer-freq"} if "--num-experts" in table else set())
    assert set(flags) == expected, f"{script}: unexpected flags {set(flags) ^ expected}"


def test_moe_layer_freq_and_router_match_qwen3_moe(repo_root, tiny_moe_hf):
    config = json.loads((tiny_moe_hf / "config.json").read_text())
    flags = model_args(repo_root, "qwen3-tiny-moe.sh")
    layers = config["num_hidden_layers"]
    every_layer = [int(i not in config["mlp_only_layers"] and (i + 1) % config["decoder_sparse_step"] == 0)
                   for i in range(layers)]
    assert parse_moe_layer_freq(flags["--moe-layer-freq"]) == every_layer == [1] * layers
    # Megatron's softmax router without --moe-router-pre-softmax renormalises the top-k weights.
    assert config["norm_topk_prob"] and "--moe-router-pre-softmax" not in flags
    assert "shared_expert_intermediate_size" not in config and "--moe-shared-expert-intermediate-size" not in flags


def parsed_model_args(repo_root, script: str):
    """MODEL_ARGS of ``script`` parsed by the Megatron flags' own parser (defaults filled in)."""
    import argparse

    from slime.utils.arguments import megatron

    parser = argparse.ArgumentParser()
    megatron.add_arguments(parser)
    argv = subprocess.run(
        ["bash", "-c", f'source "{repo_root}/scripts/models/{script}" && printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    return parser.parse_args(argv)


def assert_matches_weight_map(args, config: dict, script: str, skip=frozenset()) -> None:
    """Every model-shape arg the weight-map registry derives from ``config`` equals the script's
    (but those in `skip`), and the HF cross-check of argument validation finds nothing."""
    from slime.models import model_family
    from slime.models import check_hf_config

    for key, value in model_family(config).megatron_args(config).items():
        if key in skip:
            continue
        ours = getattr(args, key)
        ours = parse_moe_layer_freq(ours) if key == "moe_layer_freq" and isinstance(ours, str) else ours
        assert ours == value, f"{script}: {key} {ours!r} != {value!r} from config.json"
    assert check_hf_config(args, config) == [], script


@pytest.mark.parametrize("variant", tiny_variant_names())
def test_family_tiny_model_args_match_config(repo_root, variant):
    """Every family's tiny variant (slime.models registry): its scripts/models/ flags are the
    family's args of the config make_tiny_model writes (positions may come from the run's lengths; the
    aux-loss coefficient is a training choice, 0 in slime's recipes)."""
    script = tiny_variant(variant)[1].script
    config = load_tool("make_tiny_model").model_config(variant)
    args = parsed_model_args(repo_root, script)
    assert_matches_weight_map(args, config, script, {"max_position_embeddings", "moe_aux_loss_coeff"})


# Every full-size script and the released config.json it builds (tests/data/hf-configs, see SOURCES.md).
RELEASED = {
    "deepseek-v3.sh": "DeepSeek-V3",
    "kimi-k2.sh": "Kimi-K2-Instruct",
    "moonlight-16B-A3B.sh": "Moonlight-16B-A3B-Instruct",
    "glm4.5-355B-A32B.sh": "GLM-4.5",
    "glm4.5-106B-A12B.sh": "GLM-4.5-Air",
    "qwen3-0.6B.sh": "Qwen3-0.6B",
    "qwen3-4B.sh": "Qwen3-4B",
    "qwen3-30B-A3B.sh": "Qwen3-30B-A3B",
}


def released_config(repo_root, name: str) -> dict:
    return json.loads((repo_root / "tests" / "data" / "hf-configs" / name / "config.json").read_text())


def test_every_full_size_script_has_its_released_config(repo_root):
    scripts = {p.name for p in (repo_root / "scripts" / "models").glob("*.sh") if "tiny" not in p.name}
    assert scripts == set(RELEASED), f"scripts without a released config in RELEASED: {scripts ^ set(RELEASED)}"


@pytest.mark.parametrize("script", sorted(RELEASED))
def test_script_matches_its_released_config_field_by_field(repo_root, script):
    """Every field that shapes the model (the family's HF -> Megatron table, `ModelFamily.megatron_args`) agrees,
    through `check_hf_config`, the check argument validation runs on --hf-checkpoint's config."""
    from slime.models import check_hf_config

    config = released_config(repo_root, RELEASED[script])
    args = parsed_model_args(repo_root, script)
    assert check_hf_config(args, config) == [], script
    assert args.vocab_size == config["vocab_size"], script  # compared when set: the scripts all set it


@pytest.mark.parametrize("script, total_b, active_b, active_counts_embeddings", [
    # published sizes: DeepSeek-V3 671B / 37B, Kimi-K2 1.04T / 32B, Moonlight 16B / 3B, GLM-4.5 355B / 32B,
    # GLM-4.5-Air 106B / 12B. GLM's totals include its MTP layer (not built here) and its active counts
    # leave out the embedding and output layer.
    ("deepseek-v3.sh", 671, 37, True),
    ("kimi-k2.sh", 1040, 32, True),
    ("moonlight-16B-A3B.sh", 16, 3, True),
    ("glm4.5-355B-A32B.sh", 355, 32, False),
    ("glm4.5-106B-A12B.sh", 106, 12, False),
])
def test_family_model_args_match_release_and_size(repo_root, script, total_b, active_b, active_counts_embeddings):
    from slime.utils.plan.model import active_params, embedding_params, output_params, shape_from_args, total_params

    args = parsed_model_args(repo_root, script)
    assert_matches_weight_map(args, released_config(repo_root, RELEASED[script]), script)
    shape = shape_from_args(args)
    total, active = total_params(shape).total, active_params(shape)
    if not active_counts_embeddings:
        active -= embedding_params(shape).total + output_params(shape).total
    assert abs(total / 1e9 - total_b) / total_b < 0.02, (script, total)
    assert abs(active / 1e9 - active_b) / active_b < 0.05, (script, active)


def test_check_hf_config_names_a_wrong_routed_scaling_factor(repo_root):
    """GLM-4.5-Air's released routed_scaling_factor is 1.0 (GLM-4.5's is 2.5): a recipe with 2.5 is refused."""
    from slime.models import check_hf_config

    args = parsed_model_args(repo_root, "glm4.5-106B-A12B.sh")
    args.moe_router_topk_scaling_factor = 2.5
    problems = check_hf_config(args, released_config(repo_root, "GLM-4.5-Air"))
    assert problems == ["--moe-router-topk-scaling-factor 2.5 does not match 1.0 implied by the HF config"]
