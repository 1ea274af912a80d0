"""Block FP8 quantisation on CUDA gives the CPU's bytes (the senders quantise on the GPU when the
buckets live there, the CPU tests check the CPU path)."""

import pytest
import torch

from slime.utils.fp8 import dequantize_block, quantize_block, wire_view

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_quantisation_equals_cpu_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(300, 200, generator=gen) * torch.logspace(-3, 1, 200)).bfloat16()
    q_cpu, s_cpu = quantize_block(w, (128, 128))
    q_gpu, s_gpu = quantize_block(w.cuda(), (128, 128))
    assert torch.equal(q_gpu.cpu().view(torch.uint8), q_cpu.view(torch.uint8))
    assert torch.equal(s_gpu.cpu(), s_cpu)
    assert torch.equal(dequantize_block(q_gpu, s_gpu, (128, 128)).cpu(), dequantize_block(q_cpu, s_cpu, (128, 128)))
    assert wire_view(q_gpu, "cuda") is q_gpu  # NCCL broadcasts float8 as it is
