"""Tests for tools/make_tiny_model.py: loadable by transformers, deterministic, Qwen3 shaped."""

import hashlib
import json

import pytest
import torch

from tests.conftest import load_tool

tiny = load_tool("make_tiny_model")


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("variant", ["moe", "dense", "deepseek_v3", "glm4_moe"])
def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, variant):
    a = _digest(tiny.make_tiny_model(tmp_path / "a", variant=variant, seed=0))
    b = _digest(tiny.make_tiny_model(tmp_path / "b", variant=variant, seed=0))
    c = _digest(tiny.make_tiny_model(tmp_path / "c", variant=variant, seed=1))
    assert set(a) == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                      "special_tokens_map.json", "generation_config.json"}
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["config.json"] == c["config.json"]


@pytest.mark.parametrize("fixture, arch", [
    ("tiny_moe_hf", "Qwen3MoeForCausalLM"), ("tiny_dense_hf", "Qwen3ForCausalLM"),
    ("tiny_deepseek_v3_hf", "DeepseekV3ForCausalLM"), ("tiny_glm4_moe_hf", "Glm4MoeForCausalLM"),
])
def test_transformers_loads_every_weight(request, fixture, arch):
    from transformers import AutoModelForCausalLM

    path = request.getfixturevalue(fixture)
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert type(model).__name__ == arch
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        probs = model(torch.tensor([[1, 2, 3, 4]])).logits[0, -1].softmax(-1)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    assert probs.shape == (vocab,)
    # A random tiny model is close to uniform: no token is 3x more or less likely than average.
    assert probs.max() < 3.0 / vocab and probs.min() > 1.0 / (3.0 * vocab)


def test_moe_config_is_qwen3_moe_structure(tiny_moe_hf):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_moe_hf)
    assert cfg.model_type == "qwen3_moe"
    assert cfg.num_experts == 8 and cfg.num_experts_per_tok == 2 and cfg.norm_topk_prob
    assert cfg.decoder_sparse_step == 1 and cfg.mlp_only_layers == []
    assert cfg.num_attention_heads == 4 and cfg.num_key_value_heads == 2 and cfg.head_dim == 16
    assert cfg.rope_parameters["rope_theta"] == 1e6 and cfg.rms_norm_eps == 1e-6
    assert not cfg.tie_word_embeddings
    raw = json.loads((tiny_moe_hf / "config.json").read_text())
    assert raw["num_experts"] == 8 and raw["rope_theta"] == 1e6  # released-checkpoint key names


def test_tokenizer_chat_template_and_special_tokens(tiny_moe_hf):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_moe_hf)
    text = tok.apply_chat_template([{"role": "user", "content": "3 4"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n3 4<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(tok("<|im_start|>")["input_ids"]) == 1
    assert tok.convert_tokens_to_ids(["<think>", "</think>"]) == [101, 102]
    assert max(tok.get_vocab().values()) < json.loads((tiny_moe_hf / "config.json").read_text())["vocab_size"]
    for digit in "0123456789":
        assert tok(digit)["input_ids"] == [int(digit)]
    assert tok.decode([7, tok.eos_token_id], skip_special_tokens=True) == "7"
    no_think = tok.apply_chat_template([{"role": "user", "content": "1"}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_unknown_variant_names_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--variant"):
        tiny.make_tiny_model(tmp_path, variant="huge")


def test_fp8_variant_is_block_quantised_like_qwen3_fp8(tmp_path, tiny_moe_fp8_hf, tiny_moe_hf):
    from safetensors.torch import load_file

    from slime.utils.fp8 import dequantize_block

    config = json.loads((tiny_moe_fp8_hf / "config.json").read_text())
    assert config["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                             "weight_block_size": [32, 32]}
    fp8, plain = load_file(tiny_moe_fp8_hf / "model.safetensors"), load_file(tiny_moe_hf / "model.safetensors")
    quantised = sorted(n for n, t in fp8.items() if t.dtype == torch.float8_e4m3fn)
    projections = sorted(n for n in plain if n.split(".")[-2].endswith("_proj"))
    assert quantised == projections and len(quantised) == 2 * (4 + 8 * 3)
    assert set(fp8) == set(plain) | {n + "_scale_inv" for n in quantised}
    for name in quantised:
        back = dequantize_block(fp8[name], fp8[name + "_scale_inv"], (32, 32))
        assert ((back - plain[name]).abs() <= 2.0 ** -4 * plain[name].abs() + 1e-7).all()
    for name in set(plain) - set(quantised):  # norms, router gate, embeddings, lm_head
        assert torch.equal(fp8[name], plain[name])
    again = tiny.make_tiny_model(tmp_path / "again", variant="moe", seed=0, fp8_block_size=(32, 32))
    assert _digest(again) == _digest(tiny_moe_fp8_hf)
