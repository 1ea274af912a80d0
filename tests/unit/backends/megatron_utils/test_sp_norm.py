"""SequenceParallelRMSNorm: HF-style RMSNorm math, weight marked for TP grad all-reduce."""

import argparse

import pytest
import torch

from slime.backends.megatron_utils.sp_norm import SequenceParallelRMSNorm


def _config(**kw):
    base = dict(normalization="RMSNorm", params_dtype=torch.float32, sequence_parallel=True)
    return argparse.Namespace(**{**base, **kw})


def test_matches_rms_norm_and_marks_weight():
    norm = SequenceParallelRMSNorm(_config(), hidden_size=8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(3, 2, 8)
    expected = torch.nn.functional.rms_norm(x, (8,), norm.weight, eps=1e-6)
    assert torch.allclose(norm(x), expected, atol=1e-6)
    assert norm.weight.sequence_parallel is True
    assert SequenceParallelRMSNorm(_config(sequence_parallel=False), 8).weight.sequence_parallel is False


def test_bf16_input_keeps_dtype():
    norm = SequenceParallelRMSNorm(_config(params_dtype=torch.bfloat16), hidden_size=4)
    assert norm(torch.randn(2, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_layer_norm_config_is_refused():
    with pytest.raises(ValueError, match="--normalization RMSNorm"):
        SequenceParallelRMSNorm(_config(normalization="LayerNorm"), 8)


def test_zero_centered_gamma_scales_by_one_plus_weight():
    """--apply-layernorm-1p: the weight starts at 0 and the norm scales by 1 + weight."""
    norm = SequenceParallelRMSNorm(_config(layernorm_zero_centered_gamma=True), hidden_size=8, eps=1e-6)
    assert torch.equal(norm.weight, torch.zeros(8))
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-0.5, 0.5, 8))
    x = torch.randn(3, 2, 8)
    expected = torch.nn.functional.rms_norm(x, (8,), norm.weight + 1, eps=1e-6)
    assert torch.allclose(norm(x), expected, atol=1e-6)
