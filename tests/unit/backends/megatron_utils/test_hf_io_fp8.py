"""HFCheckpoint reads a block-FP8 checkpoint back as float32 (dequantised), never as raw float8."""

import torch

from slime.backends.megatron_utils.hf_io import HFCheckpoint


def test_fp8_checkpoint_reads_dequantised(tiny_moe_fp8_hf, tiny_moe_hf):
    fp8, plain = HFCheckpoint(tiny_moe_fp8_hf), HFCheckpoint(tiny_moe_hf)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.experts.3.down_proj.weight"):
        got, want = fp8.get(name), plain.get(name)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert ((got - want).abs() <= 2.0 ** -4 * want.abs() + 1e-6).all() and not torch.equal(got, want)
    for name in ("model.layers.0.mlp.gate.weight", "model.norm.weight", "lm_head.weight"):
        assert torch.equal(fp8.get(name), plain.get(name))
    assert fp8.get("model.layers.0.self_attn.q_proj.weight_scale_inv").shape == (2, 2)


def test_float_weights_saved_from_an_fp8_origin_drop_its_quantization_config(tiny_moe_fp8_hf, tmp_path):
    import json

    from slime.backends.megatron_utils.hf_io import read_hf_config, save_hf_checkpoint

    named = [("model.norm.weight", torch.ones(64))]
    plain = save_hf_checkpoint(named, tmp_path / "plain", origin_hf_dir=tiny_moe_fp8_hf)
    assert "quantization_config" not in read_hf_config(plain)
    q = [("model.layers.0.self_attn.q_proj.weight", torch.zeros(64, 64, dtype=torch.float8_e4m3fn))]
    fp8 = save_hf_checkpoint(q, tmp_path / "fp8", origin_hf_dir=tiny_moe_fp8_hf)
    assert read_hf_config(fp8)["quantization_config"] == json.loads(
        (tiny_moe_fp8_hf / "config.json").read_text())["quantization_config"]
