"""The trainer's memory hand-over (`--offload-train`): give the device memory back by tag while
colocated engines use the GPUs, take it back before the trainer needs it.

Owns `TrainerMemory`. Three tags, as SGLang's memory saver has its own:
- ``weights``: the model's parameters and Megatron's DDP parameter buffers (`extra_weights`: other
  modules, none in the trainer: its reference weights live on the host) -- copied to host memory,
  restored bit for bit;
- ``optimizer``: the optimizer's state and main (fp32) parameters -- copied, restored bit for bit;
- ``grads``: Megatron's DDP gradient buffers and the main parameters' `.grad` -- freed without a
  copy (every train step zeroes them before use) and zero-filled when taken back.

How: every tensor of a tag is reduced to its storage (views such as the DDP parameter views into
one flat buffer share it); a storage is copied into its slice of the tag's host buffer (pinned on
GPUs; one buffer per tag, allocated at the first offload and reused by every later one: pinning
~15 GB per rank on each hand-over would cost seconds and fragment host memory) and resized to 0 bytes, so the device memory returns to the allocator while every tensor, view and optimizer
reference stays the same Python object. Taking it back resizes the storage and copies the bytes
in. This is the move FSDP uses for its flat parameters; on CPU it is the same code (a storage
freed and refilled), so the loop's order and bit-exactness are tested without a GPU.

Why not torch_memory_saver: it keeps virtual addresses stable (what CUDA graphs need, hence
SGLang uses it) by intercepting cudaMalloc through LD_PRELOAD, which has no CPU counterpart and
must wrap model construction. The trainer captures no CUDA graphs, so stable addresses buy
nothing, and storage moves run identically on both devices.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import torch

logger = logging.getLogger(__name__)

TAGS = ("weights", "optimizer", "grads")
COPIED_TAGS = ("weights", "optimizer")  # grads are freed without a copy


def _storage_key(storage) -> int:
    return storage._cdata


def _byte_view(storage) -> torch.Tensor:
    """A uint8 tensor over the whole of `storage`."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _ddp_buffers(model) -> list:
    """Megatron DDP's _ParamAndGradBuffers (its `buffers` attribute shadows Module.buffers)."""
    dense = model.__dict__.get("buffers")
    return (list(dense) if isinstance(dense, list) else []) + list(getattr(model, "expert_parallel_buffers", None) or [])


def _model_tensors(model) -> Iterable[torch.Tensor]:
    """Parameters, module buffers and DDP parameter buffers of a (DDP-wrapped) model chunk."""
    yield from model.parameters()
    yield from (b for b in torch.nn.Module.buffers(model) if b is not None)
    for buf in _ddp_buffers(model):
        if getattr(buf, "param_data", None) is not None:
            yield buf.param_data


def _grad_tensors(model) -> Iterable[torch.Tensor]:
    for buf in _ddp_buffers(model):
        if getattr(buf, "grad_data", None) is not None:
            yield buf.grad_data
    for p in model.parameters():
        if getattr(p, "main_grad", None) is not None:
            yield p.main_grad
        if p.grad is not None:
            yield p.grad


def _inner_optimizers(optimizer) -> list:
    """The torch optimizers inside megatron's (chained) optimizer, or `optimizer` itself."""
    chained = getattr(optimizer, "chained_optimizers", None)
    inner = [getattr(opt, "optimizer", None) for opt in (chained or [optimizer])]
    return [opt for opt in inner if opt is not None] or ([optimizer] if hasattr(optimizer, "param_groups") else [])


def _optimizer_tensors(optimizer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(state and main parameters, main parameters' grads) of megatron's (chained) optimizer."""
    state, grads = [], []
    for inner in _inner_optimizers(optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                state.append(p)
                if p.grad is not None:
                    grads.append(p.grad)
        for values in inner.state.values():
            state.extend(v for v in values.values() if isinstance(v, torch.Tensor))
    return state, grads


class TrainerMemory:
    """Offload / onload one rank's training state by tag (idempotent per tag).

    `models`: the DDP-wrapped chunks; `optimizer`: megatron's optimizer; `extra_weights`: other
    modules offloaded with the weights (the reference model). Only storages on `device_type`
    ("cuda" on GPUs, "cpu" otherwise) move: CPU Adam's host state stays where it is."""

    def __init__(self, models: list, optimizer, extra_weights: Iterable = (), device_type: str | None = None):
        self.models, self.optimizer, self.extra_weights = list(models), optimizer, list(extra_weights)
        self.device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        self._host: dict[str, list[tuple[object, torch.Tensor | None, int]]] = {}
        self._host_buffers: dict[str, torch.Tensor] = {}  # per copied tag, reused across offloads

    def host_buffer(self, tag: str, nbytes: int) -> torch.Tensor:
        """The host buffer (uint8, pinned on GPUs) of `tag`, at least `nbytes` long: the one of the
        previous offload when it is large enough (the tag's storages keep their sizes), else a new one."""
        buffer = self._host_buffers.get(tag)
        if buffer is None or buffer.numel() < nbytes:
            self._host_buffers.pop(tag, None)  # the old one goes before the new one is pinned
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.device_type == "cuda")
            self._host_buffers[tag] = buffer
        return buffer

    def _tagged_storages(self) -> dict[str, list]:
        """Storages per tag; a storage reachable from several tags goes to the first copied one."""
        weights = [t for m in self.models + self.extra_weights for t in _model_tensors(m)]
        opt_state, opt_grads = _optimizer_tensors(self.optimizer)
        grads = [t for m in self.models for t in _grad_tensors(m)] + opt_grads
        seen: set[int] = set()
        out: dict[str, list] = {}
        for tag, tensors in (("weights", weights), ("optimizer", opt_state), ("grads", grads)):
            out[tag] = []
            for t in tensors:
                storage = t.untyped_storage()
                key = _storage_key(storage)
                if key in seen or storage.device.type != self.device_type or storage.nbytes() == 0:
                    continue
                seen.add(key)
                out[tag].append(storage)
        return out

    @property
    def offloaded(self) -> list[str]:
        """The tags whose memory is given back now."""
        return [tag for tag in TAGS if tag in self._host]

    def offload(self, tags: Iterable[str] = TAGS) -> dict[str, float]:
        """Give back the device memory of `tags`; returns bytes freed per tag and the time taken."""
        start, freed = time.monotonic(), {}
        tagged = self._tagged_storages()
        for tag in _checked(tags):
            if tag in self._host:
                continue
            entries, offset = [], 0
            buffer = self.host_buffer(tag, sum(s.nbytes() for s in tagged[tag])) if tag in COPIED_TAGS else None
            for storage in tagged[tag]:
                nbytes = storage.nbytes()
                host = None
                if buffer is not None:
                    host = buffer[offset:offset + nbytes]
                    host.copy_(_byte_view(storage))
                    offset += nbytes
                entries.append((storage, host, nbytes))
            if self.device_type == "cuda":
                torch.cuda.synchronize()
            for storage, _, _ in entries:
                storage.resize_(0)
            self._host[tag] = entries
            freed[f"perf/offload_train_{tag}_gib"] = sum(n for _, _, n in entries) / 2**30
        if self.device_type == "cuda":
            torch.cuda.empty_cache()
        return {"perf/offload_train_time": time.monotonic() - start, **freed, **self.device_memory()}

    def onload(self, tags: Iterable[str] = TAGS) -> dict[str, float]:
        """Take back the memory of `tags` given back by `offload` (copied tags get their bytes)."""
        start = time.monotonic()
        for tag in _checked(tags):
            for storage, host, nbytes in self._host.pop(tag, []):
                storage.resize_(nbytes)
                view = _byte_view(storage)
                view.copy_(host, non_blocking=True) if host is not None else view.zero_()
        if self.device_type == "cuda":
            torch.cuda.synchronize()
        return {"perf/onload_train_time": time.monotonic() - start}

    def held_bytes(self) -> dict[str, int]:
        """Bytes each tag holds on the device now (0 for an offloaded tag)."""
        return {tag: sum(s.nbytes() for s in storages) for tag, storages in self._tagged_storages().items()}

    def device_memory(self) -> dict[str, float]:
        """On GPUs, the allocator's memory held now (allocated and reserved, GiB); {} on CPU."""
        if self.device_type != "cuda":
            return {}
        return {"perf/train_memory_allocated_gib": torch.cuda.memory_allocated() / 2**30,
                "perf/train_memory_reserved_gib": torch.cuda.memory_reserved() / 2**30}


def _checked(tags: Iterable[str]) -> list[str]:
    tags = list(tags)
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise ValueError(f"unknown trainer memory tag(s) {unknown}; known: {list(TAGS)}")
    return tags
