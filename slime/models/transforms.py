"""Pure tensor transforms between Hugging Face and Megatron parameter layouts.

Owns the full-tensor (unsharded) conversions: fused QKV with megatron's GQA
interleave, fused gate/up (``linear_fc1``), vocabulary padding; and the
tensor-parallel split / merge of full Megatron tensors (column, row, QKV,
gate/up, vocab). Every function takes and returns tensors only; nothing here
knows parameter names. torch is imported inside the functions that use it (argument parsing
imports `slime.models`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionShape:
    """Attention geometry: ``num_heads`` query heads, ``num_groups`` KV heads, ``head_dim``."""

    num_heads: int
    num_groups: int
    head_dim: int

    @property
    def heads_per_group(self) -> int:
        """Query heads that share one KV head."""
        return self.num_heads // self.num_groups


def qkv_hf_to_megatron(q, k, v, shape: AttentionShape) -> torch.Tensor:
    """Fuse HF ``q [H*d, h]``, ``k [G*d, h]``, ``v [G*d, h]`` into megatron ``linear_qkv``.

    Megatron's layout, per query group g: the group's q heads, then its k head, then its
    v head; result ``[G * (H/G + 2) * d, h]`` (also works for biases ``[H*d]``).
    """
    import torch

    g, d = shape.num_groups, shape.head_dim
    tail = q.shape[1:]
    q = q.reshape(g, shape.heads_per_group * d, *tail)
    k = k.reshape(g, d, *tail)
    v = v.reshape(g, d, *tail)
    return torch.cat([q, k, v], dim=1).reshape(-1, *tail).contiguous()


def qkv_megatron_to_hf(qkv, shape: AttentionShape):
    """Inverse of ``qkv_hf_to_megatron``: returns ``(q, k, v)`` in HF layout."""
    import torch

    g, d, per = shape.num_groups, shape.head_dim, shape.heads_per_group
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (per + 2) * d, *tail)
    q, k, v = torch.split(grouped, [per * d, d, d], dim=1)
    return (
        q.reshape(-1, *tail).contiguous(),
        k.reshape(-1, *tail).contiguous(),
        v.reshape(-1, *tail).contiguous(),
    )


def gate_up_hf_to_megatron(gate, up) -> torch.Tensor:
    """Fuse HF ``gate_proj [F, h]`` and ``up_proj [F, h]`` into ``linear_fc1 [2F, h]``."""
    import torch

    return torch.cat([gate, up], dim=0).contiguous()


def gate_up_megatron_to_hf(fc1):
    """Split ``linear_fc1 [2F, h]`` into ``(gate [F, h], up [F, h])``."""
    import torch

    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate.contiguous(), up.contiguous()


def pad_vocab(weight, padded_size: int) -> torch.Tensor:
    """Pad ``[V, h]`` with zero rows to ``[padded_size, h]`` (no-op when equal)."""
    import torch

    if weight.shape[0] > padded_size:
        raise ValueError(f"vocab {weight.shape[0]} is larger than padded size {padded_size}")
    if weight.shape[0] == padded_size:
        return weight
    pad = weight.new_zeros((padded_size - weight.shape[0], *weight.shape[1:]))
    return torch.cat([weight, pad], dim=0)


def unpad_vocab(weight, vocab_size: int) -> torch.Tensor:
    """Drop padding rows: ``[Vp, h]`` -> ``[vocab_size, h]``."""
    return weight[:vocab_size].contiguous()


def _split(full, dim: int, rank: int, size: int):
    import torch

    if full.shape[dim] % size:
        raise ValueError(f"dim {dim} of shape {tuple(full.shape)} does not divide by TP {size}")
    return torch.chunk(full, size, dim=dim)[rank].contiguous()


def split_gate_up(full, rank: int, size: int) -> torch.Tensor:
    """TP shard of ``linear_fc1``: this rank's slice of gate, then its slice of up."""
    import torch

    gate, up = gate_up_megatron_to_hf(full)
    return torch.cat([_split(gate, 0, rank, size), _split(up, 0, rank, size)], dim=0)


def merge_gate_up(shards) -> torch.Tensor:
    """Inverse of ``split_gate_up`` over all TP ranks' shards (in rank order)."""
    import torch

    halves = [gate_up_megatron_to_hf(s) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)


def _concat(shards, dim: int):
    import torch

    return torch.cat(shards, dim=dim)


# TP split kind -> (split(full, rank, size), merge(list of shards)).
# QKV is column-parallel: megatron's per-group layout makes contiguous dim-0 chunks
# whole query groups, so it splits like any column-parallel weight.
SPLITS = {
    "replicated": (lambda full, rank, size: full, lambda shards: shards[0]),
    "column": (lambda full, rank, size: _split(full, 0, rank, size),
               lambda shards: _concat(shards, 0)),
    "row": (lambda full, rank, size: _split(full, 1, rank, size),
            lambda shards: _concat(shards, 1)),
    "gate_up": (split_gate_up, merge_gate_up),
}
SPLITS["qkv"] = SPLITS["column"]
SPLITS["vocab"] = SPLITS["column"]


def split_for_tp(kind: str, full, rank: int, size: int) -> torch.Tensor:
    """Shard a full Megatron tensor for TP ``rank`` of ``size`` by split ``kind``."""
    return SPLITS[kind][0](full, rank, size)


def merge_from_tp(kind: str, shards) -> torch.Tensor:
    """Rebuild a full Megatron tensor from all TP shards (rank order) by split ``kind``."""
    return SPLITS[kind][1](list(shards))
