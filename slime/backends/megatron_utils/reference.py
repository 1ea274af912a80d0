"""The reference model's weights in host memory, swapped into the actor for the reference pass.

A second full model on the GPU for the KL term costs a bf16 copy of the stage per GPU (about
7.6 GB for Qwen3-30B-A3B at TP4 / EP8), resident next to the actor through every step and every
colocated hand-over. slime keeps one model and swaps: the reference weights live on the host;
for the reference log-probs the actor's own weights are copied out (into a host backup reused
across passes), the reference's copied in, the forward pass runs on the actor model, and the
actor's weights are copied back, bit for bit. Host buffers are pinned on GPUs. The parameter and
buffer names of the reference are the actor's (the same stage built from the same flags).

Owns `HostReference`. The reference model built at start-up only receives `--ref-load`'s
weights (checkpoint.load_initial_state) and is then turned into a `HostReference` and freed.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def _named_tensors(module) -> dict[str, torch.Tensor]:
    """Parameters and buffers of the GPTModel inside `module`'s wrappers, by name."""
    while hasattr(module, "module"):
        module = module.module
    named = {f"param:{n}": p for n, p in module.named_parameters()}
    named.update({f"buffer:{n}": b for n, b in module.named_buffers() if b is not None})
    return named


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
    return host.copy_(tensor.detach())


class HostReference:
    """Reference weights on the host (`tensors`: name -> host tensor, names as `_named_tensors`)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self._backup: dict[str, torch.Tensor] | None = None  # the actor's weights during a pass

    @classmethod
    @torch.no_grad()
    def from_module(cls, module) -> "HostReference":
        """Host copies of `module`'s parameters and buffers (the loaded reference model)."""
        return cls({name: _host_copy(t) for name, t in _named_tensors(module).items()})

    def _live(self, module) -> dict[str, torch.Tensor]:
        live = _named_tensors(module)
        if live.keys() != self.tensors.keys():
            missing, extra = sorted(self.tensors.keys() - live.keys()), sorted(live.keys() - self.tensors.keys())
            raise RuntimeError(f"the reference and the actor have different tensors (reference only: {missing[:5]}, "
                               f"actor only: {extra[:5]}); they must be the same stage built from the same flags")
        return live

    @torch.no_grad()
    def refresh_from(self, module) -> None:
        """The reference becomes `module`'s current weights (`--ref-update-interval`)."""
        for name, tensor in self._live(module).items():
            self.tensors[name].copy_(tensor)

    @contextlib.contextmanager
    def swapped_into(self, module) -> Iterator[None]:
        """Run the body with the reference weights in `module` (the actor chunk); its own weights
        are restored afterwards bit for bit, also when the body raises."""
        live = self._live(module)
        with torch.no_grad():
            if self._backup is None:
                self._backup = {name: _host_copy(t) for name, t in live.items()}
            else:
                for name, t in live.items():
                    self._backup[name].copy_(t)
            for name, t in live.items():
                t.copy_(self.tensors[name], non_blocking=True)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, t in live.items():
                    t.copy_(self._backup[name], non_blocking=True)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()  # the backup is overwritten at the next pass
