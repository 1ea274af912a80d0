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
