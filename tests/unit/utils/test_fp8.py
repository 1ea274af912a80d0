"""slime.utils.fp8: block FP8 quantisation with hand-checked values, partial edge blocks, the
round-trip error bound, and which HF names an FP8 checkpoint stores as float8."""

import math

import pytest
import torch

from slime.utils.fp8 import (
    FP8_DTYPE,
    Fp8Config,
    dequantize_block,
    fp8_config_from_hf,
    quantize_block,
    quantize_named,
    quantized_buckets,
    scale_shape,
    wire_view,
)

QWEN3_FP8 = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}}


def test_one_block_by_hand():
    # amax 4 -> scale_inv 4/448 = 1/112; w * 112 = 112, -224, 56, 448: all exact e4m3 values.
    q, s = quantize_block(torch.tensor([[1.0, -2.0], [0.5, 4.0]]), (2, 2))
    assert q.dtype == FP8_DTYPE and s.dtype == torch.float32
    assert s.shape == (1, 1) and s.item() == pytest.approx(1 / 112, rel=1e-7)
    assert q.float().tolist() == [[112.0, -224.0], [56.0, 448.0]]
    torch.testing.assert_close(dequantize_block(q, s, (2, 2)), torch.tensor([[1.0, -2.0], [0.5, 4.0]]),
                               rtol=1e-6, atol=0)


def test_rounding_to_nearest_e4m3_by_hand():
    # amax 448 -> scale 1. In [16, 32) e4m3 steps by 2: 17 ties to 16 (even mantissa), 19 to 20,
    # 17.5 to 18; in [256, 448] steps by 32: 300 -> 288.
    q, s = quantize_block(torch.tensor([[448.0, 17.0, 19.0, 17.5, 300.0, -300.0]]), (1, 8))
    assert s.tolist() == [[1.0]]
    assert q.float().tolist() == [[448.0, 16.0, 20.0, 18.0, 288.0, -288.0]]


def test_partial_edge_blocks_get_their_own_scales():
    # [3, 5] in [2, 2] blocks -> scales [2, 3]; each block's amax is placed by hand.
    w = torch.zeros(3, 5)
    w[0, 0], w[1, 3], w[0, 4], w[2, 1], w[2, 2], w[2, 4] = 448.0, -224.0, 56.0, 8.0, 2.0, 0.0
    q, s = quantize_block(w, (2, 2))
    assert scale_shape(w.shape, (2, 2)) == (2, 3) and s.shape == (2, 3) and q.shape == (3, 5)
    # block (1, 2) is all zero: scale 1
    torch.testing.assert_close(s, torch.tensor([[1.0, 0.5, 0.125], [8 / 448, 2 / 448, 1.0]]), rtol=1e-7, atol=0)
    assert torch.equal(dequantize_block(q, s, (2, 2)), w)


def test_round_trip_error_within_the_e4m3_bound():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(200, 300, generator=gen) * torch.logspace(-3, 1, 300)  # columns of very different size
    block = (128, 128)
    q, s = quantize_block(w, block)
    back = dequantize_block(q, s, block)
    per_elem_scale = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]
    bound = 2.0 ** -4 * w.abs() + 2.0 ** -10 * per_elem_scale
    assert ((back - w).abs() <= bound * (1 + 1e-6)).all()
    assert (back - w).abs().max() > 0  # it did quantise
    assert (q.float().abs() <= 448).all()


def test_dequantize_refuses_a_scale_of_the_wrong_shape():
    q, s = quantize_block(torch.ones(4, 4), (2, 2))
    with pytest.raises(ValueError, match="weight_scale_inv shape"):
        dequantize_block(q, s[:1], (2, 2))


def test_config_rule_qwen3_fp8_names():
    cfg = fp8_config_from_hf(QWEN3_FP8)
    assert cfg == Fp8Config(block_size=(128, 128))
    fp8 = ["model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.o_proj.weight",
           "model.layers.0.mlp.experts.7.gate_proj.weight", "model.layers.0.mlp.experts.7.down_proj.weight",
           "model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    bf16 = ["model.layers.0.mlp.gate.weight", "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.q_norm.weight", "model.embed_tokens.weight", "lm_head.weight",
            "model.norm.weight", "model.layers.0.self_attn.q_proj.bias"]
    assert [cfg.is_fp8(n) for n in fp8] == [True] * len(fp8)
    assert [cfg.is_fp8(n) for n in bf16] == [False] * len(bf16)


def test_ignored_modules_match_on_dotted_paths_with_and_without_model_prefix():
    cfg = fp8_config_from_hf({"quantization_config": {**QWEN3_FP8["quantization_config"],
                                                      "modules_to_not_convert": ["layers.0.self_attn", "mlp.gate"],
                                                      "ignored_layers": ["model.layers.1.mlp.experts.2.up_proj"]}})
    assert not cfg.is_fp8("model.layers.0.self_attn.k_proj.weight")
    assert cfg.is_fp8("model.layers.1.self_attn.k_proj.weight")
    assert cfg.is_fp8("model.layers.0.mlp.gate_proj.weight")  # "mlp.gate" is not "mlp.gate_proj"
    assert not cfg.is_fp8("model.layers.1.mlp.experts.2.up_proj.weight")
    assert cfg.is_fp8("model.layers.1.mlp.experts.2.gate_proj.weight")


@pytest.mark.parametrize("quant, error", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e5m2"}, "fmt"),
])
def test_unsupported_fp8_configs_are_refused(quant, error):
    with pytest.raises(ValueError, match=error):
        fp8_config_from_hf({"quantization_config": quant})


def test_no_fp8_config():
    assert fp8_config_from_hf({}) is None
    assert fp8_config_from_hf({"quantization_config": {"quant_method": "awq"}}) is None


def test_quantize_named_pairs_weight_and_scale_and_buckets_keep_them_together():
    cfg = Fp8Config(block_size=(4, 4))
    bucket = [("model.layers.0.self_attn.q_proj.weight", torch.randn(6, 8)),
              ("model.layers.0.mlp.gate.weight", torch.randn(3, 8)), ("model.norm.weight", torch.ones(8))]
    out = list(quantized_buckets(lambda: [bucket, bucket[1:]], cfg)())
    assert [[(n, t.dtype, tuple(t.shape)) for n, t in b] for b in out] == [
        [("model.layers.0.self_attn.q_proj.weight", FP8_DTYPE, (6, 8)),
         ("model.layers.0.self_attn.q_proj.weight_scale_inv", torch.float32, (2, 2)),
         ("model.layers.0.mlp.gate.weight", torch.float32, (3, 8)), ("model.norm.weight", torch.float32, (8,))],
        [("model.layers.0.mlp.gate.weight", torch.float32, (3, 8)), ("model.norm.weight", torch.float32, (8,))],
    ]
    assert out[0][2][1] is bucket[1][1]  # float tensors pass unchanged
    assert quantize_named([], cfg) == []


def test_wire_view_is_bytes_on_gloo_only():
    q = torch.tensor([1.0, -2.5], dtype=FP8_DTYPE)
    view = wire_view(q, "cpu")
    assert view.dtype == torch.uint8 and view.data_ptr() == q.data_ptr()
    assert wire_view(q, "cuda") is q
    f = torch.ones(2)
    assert wire_view(f, "cpu") is f
    assert math.isclose(448.0, torch.finfo(FP8_DTYPE).max)


def test_ue8m0_scales_are_powers_of_two_and_still_fit():
    """Where SGLang requantises block scales to UE8M0 (DeepGEMM on Blackwell; checkpoints declaring
    scale_fmt "ue8m0"), the scales are rounded up to powers of two, so its requantisation is exact."""
    import dataclasses

    from slime.utils.fp8 import FP8_MAX, dequantize_block, engine_wants_ue8m0, quantize_block, quantize_named

    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(0)) * 0.02
    q, s = quantize_block(w, (128, 128), ue8m0=True)
    assert torch.equal(s, torch.exp2(torch.round(torch.log2(s))))  # powers of two
    assert (q.float().abs() <= FP8_MAX).all()
    _, plain = quantize_block(w, (128, 128))
    assert (s >= plain).all() and (s < 2 * plain).all()
    err = (dequantize_block(q, s, (128, 128)) - w).abs()
    assert (err <= 2 ** -4 * w.abs() + 2 ** -10 * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]).all()

    declared = fp8_config_from_hf({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                                           "scale_fmt": "ue8m0"}})
    assert declared.ue8m0 and not dataclasses.replace(declared, ue8m0=False).ue8m0
    (_, q2), (_, s2) = quantize_named([("model.layers.0.mlp.down_proj.weight", w)], declared)
    assert torch.equal(s2, s) and torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    if not torch.cuda.is_available():
        assert engine_wants_ue8m0(declared) is False


def test_engine_wants_ue8m0_on_blackwell_with_deepgemm(monkeypatch):
    from slime.utils.fp8 import Fp8Config, engine_wants_ue8m0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = Fp8Config(block_size=(128, 128))
    for capability, env, want in [((10, 0), {}, True), ((12, 0), {}, True), ((9, 0), {}, False),
                                  ((10, 0), {"SGLANG_ENABLE_JIT_DEEPGEMM": "false"}, False)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda c=capability: c)
        assert engine_wants_ue8m0(cfg, env) is want, (capability, env)
    assert engine_wants_ue8m0(Fp8Config(block_size=(64, 64)), {}) is False
