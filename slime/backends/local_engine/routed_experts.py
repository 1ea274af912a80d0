"""Routed-experts capture of the local engine (SGLang's `return_routed_experts`, R3).

Owns `RoutedExpertsCapture`: forward hooks on the router (`mlp.gate`) of every MoE decoder layer
of the HF model record the top-k expert ids each fed token was routed to. The scheduler arms it
before a forward and hands it the fed requests and the mask of real (non-padding) input positions
after; each request that asked for routed experts accumulates one row per fed token.

SGLang's contract (sglang 0.5.23 `state_capturer/routed_experts.py`, `get_topk`, and the
detokenizer's `_b64_encode_per_request`): `meta_info["routed_experts"]` is the base64 of an int32
array [seqlen - 1 - routed_experts_start_len, num_hidden_layers, num_experts_per_tok] in C order,
row t the token at position start + t of prompt + output (the last output token is never fed, so
it has no row). Layers without a router (dense ones) keep zeros.
"""

from __future__ import annotations

import base64
import logging
from functools import partial

import torch

logger = logging.getLogger(__name__)


def _router_indices(output, topk: int) -> torch.Tensor:
    """Top-k expert ids [tokens, k] from a router's output: transformers >= 5's TopKRouter returns
    (logits, scores, indices); an older `nn.Linear` gate returns the logits (the sparse block
    then takes the top-k of their softmax, as here)."""
    if isinstance(output, tuple):
        return output[2]
    return torch.topk(torch.softmax(output.float(), dim=-1), topk, dim=-1).indices


class RoutedExpertsCapture:
    """Hooks on every MoE layer's router; per-request rows of routed expert ids."""

    def __init__(self, model) -> None:
        config = model.config
        layers = model.model.layers
        self.num_layers = len(layers)
        self.topk = int(getattr(config, "num_experts_per_tok", 0) or 0)
        self._armed = False
        self._captured: dict[int, torch.Tensor] = {}
        self._handles = []
        if not self.topk:
            return  # a dense model: nothing is routed
        for index, layer in enumerate(layers):
            gate = getattr(getattr(layer, "mlp", None), "gate", None)
            if gate is not None:  # a sparse block (a dense MLP has gate_proj, no gate)
                self._handles.append(gate.register_forward_hook(partial(self._hook, index)))

    @property
    def supported(self) -> bool:
        """Whether the model has routers to capture."""
        return bool(self._handles)

    def _hook(self, index: int, module, inputs, output) -> None:
        if self._armed:
            self._captured[index] = _router_indices(output, self.topk).to(torch.int32)

    def arm(self, reqs) -> None:
        """Capture during the next forward if any of `reqs` asked for routed experts."""
        self._captured = {}
        self._armed = self.supported and any(r.return_routed_experts for r in reqs)

    def collect(self, reqs, real: torch.Tensor, row_of: list[int] | None = None) -> None:
        """After the armed forward: `real` [B, T] marks the real positions of the fed input; request
        i was fed row `row_of[i]` (default: row i; requests with the same prompt share a row).
        Each asking request gets its row's real positions [n, layers, k] appended."""
        if not self._armed:
            return
        self._armed = False
        batch, width = real.shape
        ids = torch.zeros(batch, width, self.num_layers, self.topk, dtype=torch.int32)
        for index, indices in self._captured.items():
            ids[:, :, index] = indices.reshape(batch, width, self.topk).cpu()
        self._captured = {}
        real = real.bool().cpu()
        for i, req in enumerate(reqs):
            if req.return_routed_experts:
                b = i if row_of is None else row_of[i]
                req.routed_experts.append(ids[b][real[b]])


def routed_experts_meta(req) -> dict:
    """`{"routed_experts": base64}` for a finished request that asked for them (SGLang's rows
    `[start, seqlen - 1)`), or {} when not asked or when the request was never fully fed (an
    abort before its prefill, max_new_tokens 0)."""
    if not req.return_routed_experts or not req.routed_experts:
        return {}
    rows = torch.cat(req.routed_experts)
    expected = len(req.prompt_ids) + len(req.output_ids) - 1
    if rows.shape[0] != expected:
        logger.warning("request %s: %d routed-expert rows for %d fed tokens; not returned", req.rid,
                       rows.shape[0], expected)
        return {}
    rows = rows[req.routed_experts_start_len:].contiguous()
    return {"routed_experts": base64.b64encode(rows.numpy().tobytes()).decode("ascii")}
