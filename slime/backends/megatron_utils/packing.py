"""Sequence packing for the trainer: several variable-length samples in one row (THD layout).

A micro-batch is packed into a single row and reaches the model as megatron's `PackedSeqParams`
(`qkv_format="thd"`, `cu_seqlens_q/kv` over the padded segments, `max_seqlen_q/kv`) on every
path: Transformer Engine's attention on GPU and our `packed_attention.PackedDotProductAttention`
on the local spec both attend within a segment only, and megatron's RoPE restarts at position 0
for each segment (it reads the positions from `cu_seqlens`, not from `position_ids`).

Segments: each sample is one segment; the padding at the end of the row (to a multiple of the TP
size under sequence parallel, or to a fixed length between pipeline stages) is one more segment,
so `cu_seqlens[-1]` always equals the row length and no token attends across a sample border.

Context parallelism (megatron's convention for THD): each sample is padded to a multiple of
2*cp and cut into 2*cp equal chunks; CP rank r holds chunks r and 2*cp-1-r (balancing the causal
work) and the rank's row is the concatenation of its chunks, sample after sample. `cu_seqlens`
and `max_seqlen` stay those of the whole (unsplit, padded) samples: Transformer Engine and
megatron's THD RoPE divide them by cp themselves. The logits of a rank then cover only its
positions, so the packed batch also carries, for every response token this rank predicts, its row
position, its target id (read from the whole sample) and its index in the micro-batch's flat
response vector; `logprobs.gather_context_parallel` reassembles the flat vector on every CP rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    """One packed micro-batch as this (CP) rank sees it.

    tokens / position_ids: [1, T] (T = this rank's row; position = index within its sample).
    cu_seqlens: [segments + 1] int32 bounds of the whole padded segments (padding included);
    `cu_seqlens[-1] == T * cp_size`. max_seqlen: the longest whole segment.
    logit_index / target_ids / flat_index: [R] for the R response tokens this rank predicts: the
    row position whose logits predict it, its token id, its index among the micro-batch's
    `sum(response_lengths)` response tokens (sample order)."""

    tokens: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    total_lengths: list[int]
    response_lengths: list[int]
    sample_ids: list[int]
    logit_index: torch.Tensor
    target_ids: torch.Tensor
    flat_index: torch.Tensor
    cp_size: int = 1

    @property
    def num_tokens(self) -> int:
        """Length of this rank's row (padding included)."""
        return int(self.tokens.shape[1])

    @property
    def num_response_tokens(self) -> int:
        return sum(self.response_lengths)


def cp_padded_length(length: int, cp_size: int) -> int:
    """A sample's length padded for CP: a multiple of 2*cp (unchanged when cp == 1)."""
    return length if cp_size == 1 else -(-length // (2 * cp_size)) * 2 * cp_size


def zigzag_positions(padded_length: int, cp_rank: int, cp_size: int) -> torch.Tensor:
    """Positions (within a sample padded by `cp_padded_length`) that CP rank `cp_rank` holds:
    chunk `cp_rank` then chunk `2*cp-1-cp_rank` of the sample's 2*cp equal chunks."""
    if cp_size == 1:
        return torch.arange(padded_length)
    if padded_length % (2 * cp_size):
        raise ValueError(f"length {padded_length} is not a multiple of 2 * cp ({2 * cp_size})")
    chunk = padded_length // (2 * cp_size)
    first, second = cp_rank * chunk, (2 * cp_size - 1 - cp_rank) * chunk
    return torch.cat([torch.arange(first, first + chunk), torch.arange(second, second + chunk)])


def local_row_length(lengths: list[int], cp_size: int = 1) -> int:
    """Tokens of a CP rank's row for samples of `lengths` before the row's end padding."""
    return sum(cp_padded_length(n, cp_size) // cp_size for n in lengths)


def pack_sequences(
    sequences: list[list[int]],
    response_lengths: list[int],
    sample_ids: list[int] | None = None,
    pad_to_multiple: int = 1,
    device: torch.device | str = "cpu",
    min_length: int = 0,
    cp_rank: int = 0,
    cp_size: int = 1,
) -> PackedBatch:
    """Pack token lists (prompt + response each) into this CP rank's row.

    The row is padded to at least `min_length` (pipeline stages exchange fixed-shape
    activations) and to a multiple of `pad_to_multiple` (TP size under sequence parallel; also
    even under CP, so the padding segment splits into 2*cp chunks like a sample).
    """
    for i, (seq, resp) in enumerate(zip(sequences, response_lengths)):
        if not 0 < resp < len(seq):
            raise ValueError(f"sample {i}: response length {resp} must be in (0, {len(seq)}) (its total length)")
    if cp_size == 1:
        return _pack_whole(sequences, response_lengths, sample_ids, pad_to_multiple, device, min_length)
    return _pack_split(sequences, response_lengths, sample_ids, pad_to_multiple, device, min_length, cp_rank, cp_size)


def _pack_split(sequences, response_lengths, sample_ids, pad_to_multiple, device, min_length, cp_rank,
                cp_size) -> PackedBatch:
    """`pack_sequences` for any CP layout (each sample cut into this rank's zigzag chunks)."""
    rows, positions, picks, bounds = [], [], [], [0]
    row_offset = flat_offset = 0
    for seq, resp in zip(sequences, response_lengths):
        padded = cp_padded_length(len(seq), cp_size)
        full = torch.zeros(padded + 1, dtype=torch.long)  # +1: the target of the last position
        full[:len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        pos = zigzag_positions(padded, cp_rank, cp_size)
        rows.append(full[pos])
        positions.append(pos)
        picks.append(_response_picks(pos, full, len(seq), resp, row_offset, flat_offset))
        bounds.append(bounds[-1] + padded)
        row_offset += len(pos)
        flat_offset += resp
    multiple = math.lcm(pad_to_multiple, 2) if cp_size > 1 else pad_to_multiple
    length = -(-max(row_offset, min_length) // multiple) * multiple
    if length > row_offset:  # the end padding: one more segment, attending to itself only
        bounds.append(bounds[-1] + (length - row_offset) * cp_size)
        rows.append(torch.zeros(length - row_offset, dtype=torch.long))
        positions.append(torch.arange(length - row_offset))
    cu = torch.tensor(bounds, dtype=torch.int32)
    logit_index, target_ids, flat_index = (torch.cat([p[k] for p in picks]) for k in range(3))
    return PackedBatch(
        tokens=torch.cat(rows).view(1, -1).to(device),
        position_ids=torch.cat(positions).view(1, -1).to(device),
        cu_seqlens=cu.to(device),
        max_seqlen=int((cu[1:] - cu[:-1]).max()),
        total_lengths=[len(s) for s in sequences],
        response_lengths=list(response_lengths),
        sample_ids=list(sample_ids) if sample_ids is not None else list(range(len(sequences))),
        logit_index=logit_index.to(device),
        target_ids=target_ids.to(device),
        flat_index=flat_index.to(device),
        cp_size=cp_size,
    )


def _pack_whole(sequences, response_lengths, sample_ids, pad_to_multiple, device, min_length) -> PackedBatch:
    """`pack_sequences` without context parallelism, in plain Python lists and one tensor per
    field (the same values as the general path; per-sample tensor ops are slow on CPU)."""
    tokens, positions, bounds, logit_index, target_ids = [], [], [0], [], []
    for seq, resp in zip(sequences, response_lengths):
        start, first = len(tokens), len(seq) - resp - 1  # positions first .. len-2 predict the response
        tokens.extend(seq)
        positions.extend(range(len(seq)))
        bounds.append(len(tokens))
        logit_index.extend(range(start + first, start + len(seq) - 1))
        target_ids.extend(seq[first + 1:])
    used = len(tokens)
    length = -(-max(used, min_length) // pad_to_multiple) * pad_to_multiple
    if length > used:  # the end padding: one more segment, attending to itself only
        bounds.append(length)
        tokens.extend([0] * (length - used))
        positions.extend(range(length - used))
    cu = torch.tensor(bounds, dtype=torch.int32)
    return PackedBatch(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device).view(1, -1),
        position_ids=torch.tensor(positions, dtype=torch.long, device=device).view(1, -1),
        cu_seqlens=cu.to(device),
        max_seqlen=max(b - a for a, b in zip(bounds, bounds[1:])),
        total_lengths=[len(s) for s in sequences],
        response_lengths=list(response_lengths),
        sample_ids=list(sample_ids) if sample_ids is not None else list(range(len(sequences))),
        logit_index=torch.tensor(logit_index, dtype=torch.long, device=device),
        target_ids=torch.tensor(target_ids, dtype=torch.long, device=device),
        flat_index=torch.arange(len(target_ids), dtype=torch.long, device=device),
        cp_size=1,
    )


def _response_picks(pos, full, length, resp, row_offset, flat_offset):
    """(row positions, target ids, flat indices) of the response tokens predicted at `pos`
    (position t predicts token t + 1; the response predictors are length-resp-1 .. length-2)."""
    first = length - resp - 1
    local = torch.nonzero((pos >= first) & (pos < length - 1)).view(-1)
    return row_offset + local, full[pos[local] + 1], flat_offset + pos[local] - first


def packed_seq_params(batch: PackedBatch):
    """megatron's `PackedSeqParams` for `batch` (THD; cu_seqlens of the whole padded segments,
    the same for queries and keys). The CP group stays the one the attention was built with."""
    from megatron.core.packed_seq_params import PackedSeqParams

    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=batch.cu_seqlens,
        cu_seqlens_kv=batch.cu_seqlens,
        max_seqlen_q=batch.max_seqlen,
        max_seqlen_kv=batch.max_seqlen,
    )
