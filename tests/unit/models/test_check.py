"""check_hf_config: MODEL_ARGS vs an HF config.json, as a pure function and inside validation
(`validate_hf_checkpoint`, the model check the entry points hand to `parse_args`)."""

import json

import pytest

from slime.models import check_hf_config, validate_hf_checkpoint
from slime.utils.arguments import ArgumentError, build_parser, parse_args
from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_ARGS, QWEN3_30B_A3B_HF_CONFIG, QWEN3_30B_A3B_MODEL_ARGS


def _model_args(extra=()):
    args = build_parser().parse_args(list(QWEN3_30B_A3B_MODEL_ARGS) + list(extra))
    return args


def test_qwen3_moe_matches():
    assert check_hf_config(_model_args(), QWEN3_30B_A3B_HF_CONFIG) == []


@pytest.mark.parametrize("key,value,flag", [
    ("num_hidden_layers", 24, "--num-layers 48"),
    ("hidden_size", 4096, "--hidden-size 2048"),
    ("num_attention_heads", 64, "--num-attention-heads 32"),
    ("num_key_value_heads", 8, "--num-query-groups 4"),
    ("intermediate_size", 1024, "--ffn-hidden-size 6144"),
    ("moe_intermediate_size", 512, "--moe-ffn-hidden-size 768"),
    ("num_experts", 64, "--num-experts 128"),
    ("num_experts_per_tok", 2, "--moe-router-topk 8"),
    ("rms_norm_eps", 1e-5, "--norm-epsilon 1e-06"),
    ("rope_theta", 10000.0, "--rotary-base 1000000"),
    ("head_dim", 64, "--kv-channels 128"),
    ("tie_word_embeddings", True, "--untie-embeddings-and-output-weights"),
])
def test_each_mismatch_names_flag_and_both_values(key, value, flag):
    config = dict(QWEN3_30B_A3B_HF_CONFIG, **{key: value})
    messages = check_hf_config(_model_args(), config)
    assert len(messages) == 1
    assert flag in messages[0] and key in messages[0] and str(value) in messages[0]


def test_rope_parameters_and_dense_models():
    config = dict(QWEN3_30B_A3B_HF_CONFIG)
    del config["rope_theta"]
    config["rope_parameters"] = {"rope_theta": 5.0, "rope_type": "default"}
    assert "--rotary-base 1000000" in check_hf_config(_model_args(), config)[0]
    dense = build_parser().parse_args(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"])
    assert check_hf_config(dense, {"num_hidden_layers": 2, "num_key_value_heads": 4}) == []
    messages = check_hf_config(dense, {"num_hidden_layers": 2, "num_experts": 8, "num_key_value_heads": 2})
    assert any("--num-experts is not set" in m for m in messages)
    assert any("--group-query-attention is not set" in m for m in messages)


def test_validation_reads_config_json(tmp_path):
    hf_dir = tmp_path / "Qwen3-30B-A3B"
    hf_dir.mkdir()
    argv = [a if a != "/root/Qwen3-30B-A3B" else str(hf_dir) for a in QWEN3_30B_A3B_ARGS]
    (hf_dir / "config.json").write_text(json.dumps(QWEN3_30B_A3B_HF_CONFIG))
    args = parse_args(argv, model_check=validate_hf_checkpoint)
    assert not any("--hf-checkpoint" in w for w in args.warnings)
    (hf_dir / "config.json").write_text(json.dumps(dict(QWEN3_30B_A3B_HF_CONFIG, num_hidden_layers=24)))
    with pytest.raises(ArgumentError, match=r"config.json.*--num-layers 48 .*num_hidden_layers=24"):
        parse_args(argv, model_check=validate_hf_checkpoint)
