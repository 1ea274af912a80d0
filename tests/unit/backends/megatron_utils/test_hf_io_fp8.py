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
