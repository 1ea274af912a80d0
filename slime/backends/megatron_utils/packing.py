"""Sequence packing for the trainer: several variable-length samples in one row, no padding waste.

A micro-batch is packed into a single row of T tokens. Attention must not cross sample borders:
on GPU with Transformer Engine that is `PackedSeqParams` (THD, cu_seqlens); on the local spec it
is an explicit block-diagonal causal mask (megatron's convention: True = masked out) plus
position ids that restart at 0 for each sample, which also avoids megatron building its default
causal mask on CUDA. Response log-probs are read back per sample from the packed logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    """One packed micro-batch. Shapes: tokens/position_ids [1, T]; attention_mask [1, 1, T, T]
    (bool, True = do not attend) or None when `cu_seqlens` drive THD attention."""

    tokens: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    cu_seqlens: torch.Tensor
    total_lengths: list[int]
    response_lengths: list[int]
    sample_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens[-1])


def pack_sequences(
    sequences: list[list[int]],
    response_lengths: list[int],
    sample_ids: list[int] | None = None,
    pad_to_multiple: int = 1,
    with_mask: bool = True,
    device: torch.device | str = "cpu",
    min_length: int = 0,
) -> PackedBatch:
    """Pack token lists (prompt + response each) into one row.

    The row is padded to at least `min_length` (pipeline stages exchange fixed-shape
    activations) and to a multiple of `pad_to_multiple` (TP size under sequence parallel);
    padded positions belong to no sample and attend only to themselves.
    """
    lengths = [len(s) for s in sequences]
    for i, (length, resp) in enumerate(zip(lengths, response_lengths)):
        if not 0 < resp < length:
            raise ValueError(f"sample {i}: response length {resp} must be in (0, {length}) (its total length)")
    total = max(sum(lengths), min_length)
    padded = -(-total // pad_to_multiple) * pad_to_multiple
    tokens = torch.zeros(1, padded, dtype=torch.long)
    position_ids = torch.zeros(1, padded, dtype=torch.long)
    cu = [0]
    for seq in sequences:
        start = cu[-1]
        tokens[0, start:start + len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        position_ids[0, start:start + len(seq)] = torch.arange(len(seq))
        cu.append(start + len(seq))
    mask = _block_causal_mask(lengths, padded) if with_mask else None
    return PackedBatch(
        tokens=tokens.to(device),
        position_ids=position_ids.to(device),
        attention_mask=mask.to(device) if mask is not None else None,
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
        total_lengths=lengths,
        response_lengths=list(response_lengths),
        sample_ids=list(sample_ids) if sample_ids is not None else list(range(len(sequences))),
    )


def _block_causal_mask(lengths: list[int], padded: int) -> torch.Tensor:
    """[1, 1, T, T] bool, True where attention is NOT allowed (megatron's convention)."""
    allowed = torch.zeros(padded, padded, dtype=torch.bool)
    start = 0
    for length in lengths:
        allowed[start:start + length, start:start + length] = torch.ones(length, length, dtype=torch.bool).tril()
        start += length
    for i in range(start, padded):  # padding attends to itself only
        allowed[i, i] = True
    return (~allowed).view(1, 1, padded, padded)


def response_slices(batch: PackedBatch) -> list[slice]:
    """For each sample, the slice of packed positions whose logits predict its response tokens
    (position t predicts token t + 1)."""
    out, start = [], 0
    for length, resp in zip(batch.total_lengths, batch.response_lengths):
        out.append(slice(start + length - resp - 1, start + length - 1))
        start += length
    return out


def response_targets(batch: PackedBatch) -> list[torch.Tensor]:
    """Each sample's response token ids, aligned with `response_slices`."""
    out, start = [], 0
    for length, resp in zip(batch.total_lengths, batch.response_lengths):
        out.append(batch.tokens[0, start + length - resp:start + length])
        start += length
    return out


def gather_response(per_token: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Concatenate the response part of a per-position tensor [T] (or [1, T]) across samples."""
    flat = per_token.reshape(-1)
    return torch.cat([flat[s] for s in response_slices(batch)])
