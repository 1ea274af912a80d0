"""The local core attention honours THD `PackedSeqParams` (attention and RoPE stay within each
packed sample) and matches megatron's sbhd attention without them."""

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from slime.backends.megatron_utils.packed_attention import PackedDotProductAttention, varlen_causal_attention
from slime.backends.megatron_utils.packing import pack_sequences, packed_seq_params

LENGTHS = [5, 9, 3, 16, 4, 7]  # several lengths in one power-of-two bucket, plus a padding segment


def _qkv(total, heads=4, groups=2, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(total, heads, dim, generator=g), torch.randn(total, groups, dim, generator=g),
            torch.randn(total, groups, dim, generator=g))


def _per_segment(q, k, v, lengths):
    outs, start = [], 0
    for n in lengths:
        seg = [x[start:start + n].transpose(0, 1) for x in (q, k, v)]
        outs.append(F.scaled_dot_product_attention(*seg, is_causal=True, enable_gqa=True).transpose(0, 1))
        start += n
    return torch.cat(outs)


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def test_varlen_attention_equals_each_segment_alone():
    q, k, v = _qkv(sum(LENGTHS))
    got = varlen_causal_attention(q, k, v, _cu(LENGTHS), scale=1 / math.sqrt(8))
    want = _per_segment(q, k, v, LENGTHS)
    assert torch.allclose(got, want, atol=1e-6)
    # plain causal attention over the packed row (what the TE path ran before) is not the same
    row = F.scaled_dot_product_attention(*(x.transpose(0, 1) for x in (q, k, v)), is_causal=True,
                                         enable_gqa=True).transpose(0, 1)
    assert torch.allclose(row[:LENGTHS[0]], want[:LENGTHS[0]], atol=1e-6)
    assert (row[LENGTHS[0]:] - want[LENGTHS[0]:]).abs().max() > 1e-2


def test_varlen_attention_value_heads_narrower_than_query_key():
    """Multi-latent attention: query/key heads of 12, value heads of 8 (DeepSeek-V3: 192 / 128)."""
    q, k, _ = _qkv(sum(LENGTHS))
    q, k = torch.cat([q, q[..., :4]], -1), torch.cat([k, k[..., :4]], -1)
    v = torch.randn(k.shape[0], k.shape[1], 8, generator=torch.Generator().manual_seed(3))
    got = varlen_causal_attention(q, k, v, _cu(LENGTHS), scale=1 / math.sqrt(12))
    assert got.shape == (q.shape[0], q.shape[1], 8)
    outs, start = [], 0
    for n in LENGTHS:
        seg = [x[start:start + n].transpose(0, 1) for x in (q, k, v)]
        outs.append(F.scaled_dot_product_attention(*seg, is_causal=True, enable_gqa=True,
                                                   scale=1 / math.sqrt(12)).transpose(0, 1))
        start += n
    assert torch.allclose(got, torch.cat(outs), atol=1e-6)


def test_varlen_attention_gradients_match():
    q, k, v = (x.requires_grad_() for x in _qkv(sum(LENGTHS), seed=1))
    varlen_causal_attention(q, k, v, _cu(LENGTHS), scale=1 / math.sqrt(8)).square().sum().backward()
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    _per_segment(q, k, v, LENGTHS).square().sum().backward()
    for a, x in zip(got, (q, k, v)):
        assert torch.allclose(a, x.grad, atol=1e-5)


def _config(**kw):
    base = dict(context_parallel_size=1, softmax_type="vanilla", window_size=None, kv_channels=8,
                attention_dropout=0.0, attention_softmax_in_fp32=True, sequence_parallel=False)
    return SimpleNamespace(**{**base, **kw})


def _module():
    from megatron.core.transformer.enums import AttnMaskType

    module = object.__new__(PackedDotProductAttention)  # MegatronModule.__init__ wants a full config
    torch.nn.Module.__init__(module)
    module.config, module.attn_mask_type = _config(), AttnMaskType.causal
    module.softmax_scale, module.dropout_p = 1 / math.sqrt(8), 0.0
    return module


def test_module_runs_thd_from_packed_seq_params():
    seqs = [list(range(1, n + 1)) for n in (5, 9, 3)]
    batch = pack_sequences(seqs, [1, 1, 1], pad_to_multiple=8)  # 17 tokens + a 7-token padding segment
    q, k, v = _qkv(batch.num_tokens)
    out = _module()(q, k, v, None, packed_seq_params=packed_seq_params(batch))
    assert out.shape == (batch.num_tokens, 4 * 8)
    want = _per_segment(q, k, v, [5, 9, 3, 7]).flatten(-2)
    assert torch.allclose(out, want, atol=1e-6)


def test_module_sbhd_honours_the_mask_or_is_causal():
    q, k, v = (x.unsqueeze(1) for x in _qkv(6))  # [s, b=1, h, d]
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1).view(1, 1, 6, 6)
    module = _module()
    with_mask, without = module(q, k, v, causal), module(q, k, v, None)
    want = _per_segment(q[:, 0], k[:, 0], v[:, 0], [6]).flatten(-2).unsqueeze(1)
    assert torch.allclose(with_mask, want, atol=1e-6) and torch.allclose(without, want, atol=1e-6)


def _rope(length, dim=8, base=10000.0):
    """megatron's RotaryEmbedding table [length, 1, 1, dim] (non-interleaved)."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    return torch.cat([angles, angles], dim=-1)[:, None, None, :]


class _OneRank:  # the CP group megatron's THD RoPE asks for: one rank
    def size(self):
        return 1

    def rank(self):
        return 0


def test_rope_positions_restart_for_each_packed_sample():
    """megatron's RoPE on THD input reads segment starts from our cu_seqlens: each sample is
    rotated from position 0, as when it runs alone."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    batch = pack_sequences([[1] * 5, [2] * 9, [3] * 3], [1, 1, 1], pad_to_multiple=4)
    freqs = _rope(batch.max_seqlen)  # GPTModel builds max(max_seqlen_q, max_seqlen_kv) positions
    config = SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=False, multi_latent_attention=False,
                             mrope_section=None)
    q = _qkv(batch.num_tokens)[0]
    got = apply_rotary_pos_emb(q, freqs, config, cu_seqlens=batch.cu_seqlens, cp_group=_OneRank())
    bounds = batch.cu_seqlens.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        alone = apply_rotary_pos_emb(q[a:b].unsqueeze(1), _rope(b - a), config, cp_group=_OneRank()).squeeze(1)
        assert torch.allclose(got[a:b], alone, atol=1e-6)
    shifted = apply_rotary_pos_emb(q.unsqueeze(1), _rope(batch.num_tokens), config, cp_group=_OneRank()).squeeze(1)
    assert not torch.allclose(got[5:14], shifted[5:14], atol=1e-3)  # row positions would differ
