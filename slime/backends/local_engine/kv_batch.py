"""The batched, left-padded KV cache of the running requests.

Owns `BatchKV`: per layer one key and one value tensor [B, H_kv, L, D] whose row b holds request
b's cached tokens right-aligned (left padding), plus a `mask` [B, L] (1 = real token). A decode
step feeds one new token per row with `attention_mask = [mask | 1]` and explicit `position_ids`
(each row's real length), so rows of different lengths share one batched forward. Rows are added
after their (batched, left-padded) prefill and removed as soon as their request finishes; fully padded leading
columns are trimmed away.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class BatchKV:
    """Left-padded batched KV cache; row order is the order of the scheduler's running list."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.mask: torch.Tensor | None = None
        self._cache = None  # the DynamicCache wrapping keys/values, reused while rows do not change

    @property
    def rows(self) -> int:
        """Number of requests in the batch."""
        return 0 if self.mask is None else self.mask.shape[0]

    def nbytes(self) -> int:
        """Bytes held by the keys, values and mask."""
        keys, values, mask = self.keys, self.values, self.mask  # one consistent-enough snapshot
        tensors = keys + values + ([mask] if mask is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def clear(self) -> None:
        """Drop every row (and the memory)."""
        self.keys, self.values, self.mask, self._cache = [], [], None, None

    def add_rows(self, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor) -> None:
        """Append a prefilled group: per layer [n, H, P, D] tensors, left-padded as `mask` [n, P] says."""
        self._cache = None
        if self.mask is None:
            self.keys, self.values, self.mask = list(keys), list(values), mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        pad_old, pad_new = width - self.mask.shape[1], width - mask.shape[1]

        def join(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            return torch.cat([F.pad(old, (0, 0, pad_old, 0)), F.pad(new, (0, 0, pad_new, 0))])

        self.keys = [join(o, n) for o, n in zip(self.keys, keys)]
        self.values = [join(o, n) for o, n in zip(self.values, values)]
        self.mask = torch.cat([F.pad(self.mask, (pad_old, 0)), F.pad(mask, (pad_new, 0))])

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order) and trim leading columns that are padding in every row."""
        if not rows:
            self.clear()
            return
        self._cache = None
        index = torch.tensor(rows, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        start = int(mask.any(0).nonzero()[0])
        self.mask = mask[:, start:]
        self.keys = [k.index_select(0, index)[:, :, start:] for k in self.keys]
        self.values = [v.index_select(0, index)[:, :, start:] for v in self.values]

    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention_mask [B, L+1], position_ids [B, 1]) for feeding one new token per row."""
        ones = torch.ones(self.rows, 1, dtype=self.mask.dtype, device=self.mask.device)
        return torch.cat([self.mask, ones], dim=1), self.mask.sum(1, keepdim=True)

    def to_cache(self):
        """A transformers `DynamicCache` holding the batch (the forward appends to it).

        Rebuilt (one copy) only after rows were added or removed; between those, the cache the
        last decode step grew is handed back as is.
        """
        if self._cache is None:
            from transformers import DynamicCache

            self._cache = DynamicCache(ddp_cache_data=list(zip(self.keys, self.values)))
        return self._cache

    def decode_logits(self, model, ids: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (`ids` [B, 1]) through the HF forward; returns logits [B, V]."""
        mask, positions = self.decode_inputs()
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.to_cache(),
                    use_cache=True)
        self.absorb(out.past_key_values)
        return out.logits[:, -1]

    def absorb(self, cache) -> None:
        """Adopt the grown tensors of `cache` after a decode step (one new real column)."""
        self._cache = cache
        self.keys = [layer.keys for layer in cache.layers]
        self.values = [layer.values for layer in cache.layers]
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
