"""scripts/models/qwen3-tiny*.sh: every Megatron flag agrees with the config.json the tool writes."""

import json
import subprocess

import pytest

from slime.utils.arguments.moe_layer_freq import parse_moe_layer_freq


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


def assert_matches_weight_map(args, config: dict, script: str) -> None:
    """Every model-shape arg the weight-map registry derives from ``config`` equals the script's, and
    the HF cross-check of argument validation finds nothing."""
    from slime.backends.megatron_utils.weight_maps import model_family
    from slime.utils.arguments.hf_config import check_hf_config

    for key, value in model_family(config).megatron_args(config).items():
        ours = getattr(args, key)
        ours = parse_moe_layer_freq(ours) if key == "moe_layer_freq" and isinstance(ours, str) else ours
        assert ours == value, f"{script}: {key} {ours!r} != {value!r} from config.json"
    assert check_hf_config(args, config) == [], script


@pytest.mark.parametrize("script, fixture", [
    ("deepseek-v3-tiny.sh", "tiny_deepseek_v3_hf"),
    ("glm4.5-tiny.sh", "tiny_glm4_moe_hf"),
])
def test_family_tiny_model_args_match_config(request, repo_root, script, fixture):
    config = json.loads((request.getfixturevalue(fixture) / "config.json").read_text())
    assert_matches_weight_map(parsed_model_args(repo_root, script), config, script)


# The architecture keys of the released config.json files (Hugging Face hub, as published).
_DEEPSEEK_V3 = dict(
    architectures=["DeepseekV3ForCausalLM"], vocab_size=129280, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
    n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
    qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, topk_method="noaux_tc", n_group=8, topk_group=4,
    num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True, scoring_func="sigmoid",
    max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000, tie_word_embeddings=False,
    rope_scaling=dict(beta_fast=32, beta_slow=1, factor=40, mscale=1.0, mscale_all_dim=1.0,
                      original_max_position_embeddings=4096, type="yarn"))
_KIMI_K2 = dict(
    _DEEPSEEK_V3, vocab_size=163840, num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384,
    routed_scaling_factor=2.827, n_group=1, topk_group=1, first_k_dense_replace=1, max_position_embeddings=131072,
    rope_theta=50000.0, rope_scaling=dict(beta_fast=1.0, beta_slow=1.0, factor=32.0, mscale=1.0, mscale_all_dim=1.0,
                                          original_max_position_embeddings=4096, type="yarn"))
_MOONLIGHT = dict(
    _DEEPSEEK_V3, vocab_size=163840, hidden_size=2048, intermediate_size=11264, moe_intermediate_size=1408,
    num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64,
    routed_scaling_factor=2.446, q_lora_rank=None, n_group=1, topk_group=1, num_experts_per_tok=6,
    first_k_dense_replace=1, max_position_embeddings=8192, rope_theta=50000.0, rope_scaling=None, rms_norm_eps=1e-5)
_GLM45 = dict(
    architectures=["Glm4MoeForCausalLM"], vocab_size=151552, hidden_size=5120, intermediate_size=12288,
    moe_intermediate_size=1536, num_hidden_layers=92, num_attention_heads=96, num_key_value_heads=8, head_dim=128,
    n_shared_experts=1, n_routed_experts=160, num_experts_per_tok=8, first_k_dense_replace=3, routed_scaling_factor=2.5,
    n_group=1, topk_group=1, partial_rotary_factor=0.5, rope_theta=1000000, attention_bias=True, use_qk_norm=True,
    rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False, norm_topk_prob=True)
_GLM45_AIR = dict(_GLM45, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=46,
                  n_routed_experts=128, first_k_dense_replace=1, use_qk_norm=False)


@pytest.mark.parametrize("script, config, total_b, active_b, active_counts_embeddings", [
    # published sizes: DeepSeek-V3 671B / 37B, Kimi-K2 1.04T / 32B, Moonlight 16B / 3B, GLM-4.5 355B / 32B,
    # GLM-4.5-Air 106B / 12B. GLM's totals include its MTP layer (not built here) and its active counts
    # leave out the embedding and output layer.
    ("deepseek-v3.sh", _DEEPSEEK_V3, 671, 37, True),
    ("kimi-k2.sh", _KIMI_K2, 1040, 32, True),
    ("moonlight-16B-A3B.sh", _MOONLIGHT, 16, 3, True),
    ("glm4.5-355B-A32B.sh", _GLM45, 355, 32, False),
    ("glm4.5-106B-A12B.sh", _GLM45_AIR, 106, 12, False),
])
def test_family_model_args_match_release_and_size(repo_root, script, config, total_b, active_b,
                                                  active_counts_embeddings):
    from slime.utils.plan.model import active_params, embedding_params, output_params, shape_from_args, total_params

    args = parsed_model_args(repo_root, script)
    assert_matches_weight_map(args, config, script)
    shape = shape_from_args(args)
    total, active = total_params(shape).total, active_params(shape)
    if not active_counts_embeddings:
        active -= embedding_params(shape).total + output_params(shape).total
    assert abs(total / 1e9 - total_b) / total_b < 0.02, (script, total)
    assert abs(active / 1e9 - active_b) / active_b < 0.05, (script, active)
