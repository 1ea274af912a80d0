"""Preallocated KV cache and the lean batched decode step of the local engine (Qwen3 family).

Owns `SlotKV` and `supports_slot_kv`. Per layer one key and one value buffer
[rows, H_kv, columns, D], allocated once and grown by doubling: row b is the scheduler's b-th
running request and holds its tokens at columns 0..len_b-1 (its positions; no padding, so nothing
is re-aligned when requests join or leave). `decode_logits(model, ids)` runs ONE forward for all
rows directly over the HF model's modules (embedding, per layer: input norm, q/k/v projections and
q/k norms, RoPE, the new key/value written in place at column len_b, SDPA over columns 0..max len
with a length mask, o_proj, the layer's MLP or MoE block; final norm, lm_head), which is the
HF decoder layer's math without its per-step 4-D mask building and cache concatenation. Module
hooks (e.g. on MoE routers) still fire: the modules themselves are called. The new keys/values
of all rows go in with one `index_copy_` per buffer.

`supports_slot_kv(model)` accepts the structures this math is exact for (Qwen3 / Qwen3-MoE, full
attention); any other model keeps `BatchKV` and the HF forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe")


def supports_slot_kv(model) -> bool:
    """True when `model` is a full-attention Qwen3 / Qwen3-MoE causal LM (the math `SlotKV` runs)."""
    config = model.config
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None) is not None:
        return False
    layer_types = getattr(config, "layer_types", None) or []
    return all(t == "full_attention" for t in layer_types) and hasattr(model, "lm_head")


def _norm(module, x: torch.Tensor) -> torch.Tensor:
    """An HF RMSNorm module's math in one fused op (weight * x / rms(x), in float32)."""
    eps = getattr(module, "variance_epsilon", None)
    eps = module.eps if eps is None else eps
    return module.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) * sin = roll(x, D/2) * (sin with its
    first half negated)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def _moe(mlp, x: torch.Tensor) -> torch.Tensor:
    """A Qwen3-MoE sparse block on a few decode tokens: the router module (its hooks fire), then
    every expert on every token in two matmuls (the experts a token was not routed to get weight
    exactly 0), instead of HF's loop over the experts hit. Used for few experts only (see `_mlp`)."""
    experts, flat = mlp.experts, x.reshape(-1, x.shape[-1])
    num, inter = experts.gate_up_proj.shape[0], experts.gate_up_proj.shape[1] // 2
    _, weights, index = mlp.gate(flat)  # [N, k] routing weights and expert ids
    dense = torch.zeros(flat.shape[0], num, dtype=flat.dtype, device=flat.device).scatter_(1, index, weights.to(flat.dtype))
    gate_up = (flat @ experts.gate_up_proj.reshape(num * 2 * inter, -1).t()).view(-1, num, 2 * inter)  # [N, E, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    hidden = (experts.act_fn(gate) * up).transpose(0, 1)  # [E, N, I]
    out = torch.bmm(hidden, experts.down_proj.transpose(1, 2))  # [E, N, H]
    return torch.bmm(dense[:, None, :], out.transpose(0, 1)).reshape(x.shape)  # sum_e dense[n, e] out[e, n]


# Experts up to which `_moe` computes all of them (cheaper than routing at this size).
DENSE_MOE_MAX_EXPERTS = 16


def _mlp(block, x: torch.Tensor) -> torch.Tensor:
    mlp = block.mlp
    if type(mlp).__name__ == "Qwen3MoeSparseMoeBlock" and mlp.experts.gate_up_proj.shape[0] <= DENSE_MOE_MAX_EXPERTS:
        return _moe(mlp, x)
    return mlp(x)


class SlotKV:
    """Preallocated batched KV cache; row order is the order of the scheduler's running list."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths: torch.Tensor | None = None  # [row capacity] cached tokens per row (long)
        self._rows = 0

    @property
    def rows(self) -> int:
        """Number of requests in the batch."""
        return self._rows

    def nbytes(self) -> int:
        """Bytes held by the preallocated buffers."""
        keys, values = self.keys, self.values  # one consistent-enough snapshot
        return sum(t.numel() * t.element_size() for t in keys + values)

    def clear(self) -> None:
        """Drop every row (and the memory)."""
        self.keys, self.values, self.lengths, self._rows = [], [], None, 0

    def _reserve(self, rows: int, columns: int, like: torch.Tensor, num_layers: int) -> None:
        """Grow the buffers (doubling) to at least `rows` x `columns`, keeping their contents."""
        if self.keys:
            have_rows, _, have_cols, _ = self.keys[0].shape
            if rows <= have_rows and columns <= have_cols:
                return
            rows = max(rows, 2 * have_rows) if rows > have_rows else have_rows
            columns = max(columns, 2 * have_cols) if columns > have_cols else have_cols
        _, heads, _, dim = like.shape

        def grown(old: torch.Tensor | None) -> torch.Tensor:
            new = like.new_zeros(rows, heads, columns, dim)
            if old is not None:
                new[: old.shape[0], :, : old.shape[2]] = old
            return new

        olds = self.keys or [None] * num_layers
        self.keys = [grown(o) for o in olds]
        self.values = [grown(o) for o in (self.values or [None] * num_layers)]
        lengths = torch.zeros(rows, dtype=torch.long, device=like.device)
        if self.lengths is not None:
            lengths[: self.lengths.shape[0]] = self.lengths
        self.lengths = lengths

    def add_rows(self, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor) -> None:
        """Append a prefilled group: per layer [n, H, P, D] tensors, left-padded as `mask` [n, P] says."""
        n, width = mask.shape
        real = mask.sum(1).tolist()
        start = self._rows
        longest = max(real + ([int(self.lengths[:start].max())] if start else []))
        self._reserve(start + n, max(2 * longest, 16), keys[0], len(keys))
        for layer, (k, v) in enumerate(zip(keys, values)):
            for j, length in enumerate(real):
                self.keys[layer][start + j, :, :length] = k[j, :, width - length:]
                self.values[layer][start + j, :, :length] = v[j, :, width - length:]
        self.lengths[start:start + n] = torch.tensor(real, dtype=torch.long)
        self._rows = start + n

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order): row i becomes old row rows[i]; only moved rows are copied."""
        if not rows:
            self.clear()
            return
        moved = [(i, r) for i, r in enumerate(rows) if i != r]
        if moved:
            dst = torch.tensor([i for i, _ in moved])
            src = torch.tensor([r for _, r in moved])
            used = int(self.lengths[src].max())
            for buf in self.keys + self.values:
                buf[dst, :, :used] = buf[src, :, :used]  # the right side is a copy: no aliasing
            self.lengths[dst] = self.lengths[src]
        self._rows = len(rows)

    def decode_logits(self, model, ids: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (`ids` [B, 1]); returns the next-token logits [B, V]."""
        batch = self._rows
        columns = int(self.lengths[:batch].max()) + 1  # the longest row after this token
        self._reserve(batch, columns, self.keys[0], len(self.keys))
        lengths = self.lengths[:batch]
        inner = model.model
        hidden = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(hidden, lengths[:, None])
        half = sin.shape[-1] // 2
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        cos, signed_sin = cos[:, None], signed_sin[:, None]  # [B, 1, 1, D]: one position per row
        # the additive mask SDPA would build from a boolean one in every layer (0 / -inf), built once
        mask = torch.zeros(batch, 1, 1, columns, dtype=hidden.dtype, device=ids.device).masked_fill_(
            (torch.arange(columns, device=ids.device)[None, :] > lengths[:, None])[:, None, None, :], float("-inf"))
        _, heads_kv, capacity, dim = self.keys[0].shape
        # flat index of (row b, kv head h, column len_b) in a buffer viewed as [rows * H * columns, D]
        slots = ((torch.arange(batch, device=ids.device)[:, None] * heads_kv
                  + torch.arange(heads_kv, device=ids.device)[None, :]) * capacity + lengths[:, None]).reshape(-1)
        for layer, block in enumerate(inner.layers):
            attn = block.self_attn
            x = _norm(block.input_layernorm, hidden)
            q = _rope(_norm(attn.q_norm, attn.q_proj(x).view(batch, 1, -1, dim)).transpose(1, 2), cos,
                      signed_sin)
            k = _rope(_norm(attn.k_norm, attn.k_proj(x).view(batch, 1, -1, dim)).transpose(1, 2), cos,
                      signed_sin)
            v = attn.v_proj(x).view(batch, 1, -1, dim).transpose(1, 2)
            keys, values = self.keys[layer], self.values[layer]
            keys.view(-1, dim).index_copy_(0, slots, k.reshape(-1, dim))  # the new key/value in place
            values.view(-1, dim).index_copy_(0, slots, v.reshape(-1, dim))
            out = F.scaled_dot_product_attention(q, keys[:batch, :, :columns], values[:batch, :, :columns],
                                                 attn_mask=mask, scale=attn.scaling, enable_gqa=True)
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(batch, 1, -1))
            hidden = hidden + _mlp(block, _norm(block.post_attention_layernorm, hidden))
        self.lengths[:batch] += 1
        return model.lm_head(_norm(inner.norm, hidden)[:, -1])
