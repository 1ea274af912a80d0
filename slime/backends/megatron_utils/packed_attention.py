"""Core attention of the local spec that honours `PackedSeqParams` (THD) like Transformer Engine.

megatron-core's `DotProductAttention` refuses `packed_seq_params`, and a dense block-diagonal
mask over a packed row costs O(T^2) in the row's tokens. `PackedDotProductAttention` takes its
place in the local layer spec (`layer_specs.local_block_spec`): for THD input it runs causal
attention within each segment of `cu_seqlens` only, batching segments of similar length into
one `scaled_dot_product_attention` call (right-padded: with a causal mask the real queries never
see the padded keys), so the cost is the sum of the segments' squares. Without
`packed_seq_params` (sbhd) it honours the given `attention_mask` (True = masked, megatron's
convention) or, without one, the layer's causal mask type. THD attention is always causal (GPT
self-attention; Transformer Engine runs it as `padding_causal`). Only the kernel differs from the GPU path: the plumbing
(`PackedSeqParams`, RoPE per segment) is megatron's own on both.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule


def _segment_buckets(lengths: list[int]) -> dict[int, list[int]]:
    """Segment indices grouped by the power of two their length rounds up to (padding at most
    doubles a segment, so a bucket costs at most 4x the sum of its segments' squares)."""
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        if n > 0:
            buckets.setdefault(1 << (n - 1).bit_length(), []).append(i)
    return buckets


def varlen_causal_attention(query, key, value, cu_seqlens, *, scale: float, dropout_p: float = 0.0):
    """query [T, nq, d], key/value [T, nk, d] (nq a multiple of nk), cu_seqlens [S+1] with
    cu_seqlens[-1] == T -> [T, nq, d]: causal attention within each segment."""
    bounds = cu_seqlens.tolist()
    starts, lengths = bounds[:-1], [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    if bounds[-1] != query.shape[0]:
        raise ValueError(f"cu_seqlens ends at {bounds[-1]}, the packed row has {query.shape[0]} tokens")
    out = query.new_zeros(query.shape[0], query.shape[1], value.shape[-1])
    gqa = query.shape[1] != key.shape[1]
    for members in _segment_buckets(lengths).values():
        width = max(lengths[i] for i in members)
        offsets = torch.arange(width, device=query.device)
        seg_starts = torch.tensor([starts[i] for i in members], device=query.device)
        seg_lengths = torch.tensor([lengths[i] for i in members], device=query.device)
        valid = offsets[None, :] < seg_lengths[:, None]  # [n, width]
        index = torch.where(valid, seg_starts[:, None] + offsets[None, :], 0)

        def gather(x):  # [T, h, d] -> [n, h, width, d]
            return x[index].permute(0, 2, 1, 3)

        ctx = F.scaled_dot_product_attention(gather(query), gather(key), gather(value), is_causal=True,
                                             dropout_p=dropout_p, scale=scale, enable_gqa=gqa)
        out[index[valid]] = ctx.permute(0, 2, 1, 3)[valid]
    return out


class PackedDotProductAttention(MegatronModule):
    """Drop-in core attention for megatron's local spec (same constructor and forward as
    `DotProductAttention`) that supports THD `packed_seq_params`; no parameters. Value heads may
    be narrower than query/key heads (multi-latent attention)."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None, k_channels: int | None = None,
                 v_channels: int | None = None):
        # k_channels / v_channels: multi-latent attention's query/key and value head dims (they
        # differ); the kernels read both from the tensors, MLA passes its softmax_scale.
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("--context-parallel-size > 1 needs Transformer Engine attention "
                             "(--transformer-impl transformer_engine)")
        if config.softmax_type != "vanilla" or config.window_size is not None:
            raise ValueError("the local core attention supports vanilla softmax without a sliding window; "
                             "use --transformer-impl transformer_engine")
        self.config = config
        self.attn_mask_type = attn_mask_type
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def _dropout(self) -> float:
        return self.dropout_p if self.training else 0.0

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """THD: query [T, np, hn] -> [T, np*hn]; sbhd: [s, b, np, hn] -> [s, b, np*hn]."""
        if attention_bias is not None:
            raise ValueError("attention_bias is not supported by the local core attention")
        dtype = query.dtype
        if self.config.attention_softmax_in_fp32 and dtype in (torch.float16, torch.bfloat16):
            query, key, value = query.float(), key.float(), value.float()
        with self._rng():
            if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
                out = self._thd(query, key, value, packed_seq_params)
            else:
                causal = (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal
                out = self._sbhd(query, key, value, attention_mask, causal)
        return out.to(dtype).flatten(-2)

    def _rng(self):
        """Dropout under megatron's model-parallel RNG fork, as `DotProductAttention` does."""
        from contextlib import nullcontext

        from megatron.core import tensor_parallel

        if self._dropout() == 0.0 or self.config.sequence_parallel:
            return nullcontext()
        return tensor_parallel.get_cuda_rng_tracker().fork()

    def _thd(self, query, key, value, params):
        cu_q = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
        cu_kv = params.cu_seqlens_kv_padded if params.cu_seqlens_kv_padded is not None else params.cu_seqlens_kv
        if not torch.equal(cu_q, cu_kv):
            raise ValueError("packed self-attention needs the same cu_seqlens for queries and keys")
        return varlen_causal_attention(query, key, value, cu_q, scale=self.softmax_scale,
                                       dropout_p=self._dropout())

    def _sbhd(self, query, key, value, attention_mask, causal: bool):
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, h, s, d]
        mask = None if attention_mask is None else ~attention_mask.to(torch.bool)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and causal,
                                             dropout_p=self._dropout(), scale=self.softmax_scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return ctx.permute(2, 0, 1, 3)
