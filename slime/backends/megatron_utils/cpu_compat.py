"""Named patches that let megatron-core run on a machine without CUDA.

Owns every change we make to megatron-core / torch behaviour for CPU runs. Nothing
is patched at import time: backend initialisation calls ``apply_cpu_compat()`` when
``torch.cuda.is_available()`` is false. Each patch is a small function with a
docstring saying why it is needed, which upstream version needs it and when it can
go; each is idempotent (applying twice is a no-op) and reports whether it changed
anything. Verified against megatron-core 0.16.1 on torch 2.13.0+cpu. What breaks for
want of Transformer Engine or Apex rather than of CUDA is in ``te_absent`` (applied on
GPU machines too; ``apply_cpu_compat`` applies it first).
"""

import logging

import torch

from slime.backends.megatron_utils.te_absent import apply_te_absent_patches

logger = logging.getLogger(__name__)

_MARK = "_slime_cpu_compat"


def _cpu_device(*_args, **_kwargs) -> torch.device:
    """Stand-in for ``torch.cuda.current_device()``: the CPU device."""
    return torch.device("cpu")


_cpu_device.__dict__[_MARK] = True


def patch_current_device() -> bool:
    """``torch.cuda.current_device()`` -> ``torch.device('cpu')``.

    Why: megatron-core 0.16.1 passes ``device=torch.cuda.current_device()`` when it
    allocates buffers (rotary ``inv_freq`` moved "to GPU" on first forward, TP linear
    layers' gather buffers, GPTModel's MTP / softmax-offset buffers), which raises
    "Torch not compiled with CUDA enabled" on CPU builds. Can go when megatron asks a
    device helper instead of CUDA directly (not the case up to 0.16.x).
    """
    if getattr(torch.cuda.current_device, _MARK, False):
        return False
    torch.cuda.current_device = _cpu_device
    return True


def _no_sync(*_args, **_kwargs) -> None:
    """Stand-in for ``torch.cuda.synchronize()``: CPU work is already synchronous."""


_no_sync.__dict__[_MARK] = True


def patch_cuda_synchronize() -> bool:
    """``torch.cuda.synchronize()`` -> no-op.

    Why: megatron-core 0.16.1's ``dist_checkpointing`` save path calls it after moving
    tensors to host (``FileSystemWriterAsync.preload_tensors``, ``async_utils``,
    ``fully_parallel``); without CUDA it raises "Torch not compiled with CUDA enabled",
    so ``dist_checkpointing.save`` fails on CPU. Can go when those calls are guarded by
    ``torch.cuda.is_available()`` upstream.
    """
    if getattr(torch.cuda.synchronize, _MARK, False):
        return False
    torch.cuda.synchronize = _no_sync
    return True


def _cpu_get_rng_state(device="cuda", clone: bool = False, graph_safe: bool = False):
    """CPU twin of megatron's ``_get_cuda_rng_state``: the CPU generator state."""
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state, device=-1, graph_safe: bool = False) -> None:
    """CPU twin of megatron's ``_set_cuda_rng_state``."""
    torch.set_rng_state(new_state)


_cpu_get_rng_state.__dict__[_MARK] = True
_cpu_set_rng_state.__dict__[_MARK] = True


def patch_rng_tracker() -> bool:
    """Megatron's CUDA RNG tracker forks the CPU generator instead of the CUDA one.

    Why: attention dropout and expert / TP weight init run under
    ``get_cuda_rng_tracker().fork()``, which reads and sets the CUDA generator state
    (``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` in
    ``megatron.core.tensor_parallel.random``) and fails without CUDA (0.16.1). The
    states themselves are registered by ``parallel._cpu_model_parallel_seed``. Can go
    if megatron's tracker grows a CPU path.
    """
    from megatron.core.tensor_parallel import random as mp_random

    if getattr(mp_random._get_cuda_rng_state, _MARK, False):
        return False
    mp_random._get_cuda_rng_state = _cpu_get_rng_state
    mp_random._set_cuda_rng_state = _cpu_set_rng_state
    return True


def _map_device(device):
    """``cuda`` / ``cuda:N`` / ``torch.device('cuda')`` / int -> ``cpu``; others unchanged."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
        return torch.device("cpu")
    return device


_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
}


# functions CudaToCpuMode rewrites whatever their keyword arguments
_REWRITTEN = frozenset({torch.Tensor.cuda, torch.Tensor.type, torch.Tensor.to})


class CudaToCpuMode(torch.overrides.TorchFunctionMode):
    """Torch function mode that runs CUDA-addressed calls on the CPU.

    ``device=`` keyword arguments naming CUDA become CPU, ``Tensor.cuda()`` returns the
    tensor itself, and ``Tensor.type()`` (no argument) reports ``torch.cuda.*Tensor``
    names so megatron's dtype checks accept CPU parameters.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # fast path (almost every op): nothing CUDA-specific to rewrite
        if func not in _REWRITTEN and not (kwargs and "device" in kwargs):
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return _CUDA_TYPE_NAMES.get(name, name)
        if "device" in kwargs:
            kwargs["device"] = _map_device(kwargs["device"])
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _map_device(args[1])) + tuple(args[2:])
        return func(*args, **kwargs)


def patch_cuda_device_mode() -> bool:
    """Enter ``CudaToCpuMode`` for the calling thread for the rest of the process.

    Why: megatron-core 0.16.1 allocates literal ``device='cuda'`` tensors (grad scaler,
    optimizer ``found_inf`` / ``_scale_one``, ``clip_grads`` norms, token counters in
    ``pipeline_parallel.schedules``), calls ``.cuda()`` when loading optimizer state,
    the distributed optimizer accepts only ``param.type()`` in
    ``torch.cuda.{Float,Half,BFloat16}Tensor``, and the local attention builds its
    default causal mask with ``device="cuda"`` (``transformer.utils.get_default_causal_mask``).
    Too many call sites to patch one by one; a torch function mode maps them all. Can go
    when megatron allocates on the parameters' device (not the case up to 0.16.x). The
    mode is thread-local: it covers the thread that called ``apply_cpu_compat``.
    """
    from torch.overrides import _get_current_function_mode_stack

    if any(isinstance(mode, CudaToCpuMode) for mode in _get_current_function_mode_stack()):
        return False
    CudaToCpuMode().__enter__()
    return True


class HostStream:
    """CPU stand-in of a ``torch.cuda.Stream``: host work is synchronous, so waiting, recording and
    synchronizing have nothing to order; it has the methods megatron's callers use."""

    def wait_stream(self, _other) -> None:
        return None

    def record_event(self, _event=None) -> "HostEvent":
        return HostEvent()

    def synchronize(self) -> None:
        return None


class HostEvent:
    """CPU stand-in of a ``torch.cuda.Event`` recorded on a ``HostStream``."""

    def synchronize(self) -> None:
        return None

    def wait(self, _stream=None) -> None:
        return None


def patch_host_streams() -> bool:
    """``torch.cuda.current_stream()`` / ``torch.cuda.Stream()`` -> a ``HostStream``.

    Why: megatron-core 0.16.1's ``HybridDeviceOptimizer`` (``--optimizer-cpu-offload``, the MoE
    recipes' CPU Adam) orders its device-to-host grad copies and host-to-device parameter
    copies on CUDA streams (``torch.cuda.Stream()`` with ``--overlap-cpu-optimizer-d2h-h2d``,
    ``torch.cuda.current_stream()`` without), which raise on a CPU build. On CPU every copy is
    synchronous, so the stand-in orders nothing; ``torch.cuda.stream(s)`` already enters and
    leaves without CUDA. Can go when megatron asks the parameters' device for its streams.
    """
    if isinstance(torch.cuda.Stream, type) and issubclass(torch.cuda.Stream, HostStream):
        return False
    torch.cuda.current_stream = lambda *_args, **_kwargs: HostStream()
    torch.cuda.Stream = HostStream
    return True


def _host_param_groups(self, offload_fraction: float):
    """CPU twin of ``HybridDeviceOptimizer._get_sub_optimizer_param_groups``: the model's
    parameters are the device's (on CPU, the trainer's device is the host).

    As on GPU, the first ``offload_fraction`` of the parameters (by numel) get a host copy that
    the CPU optimizer steps (grads copied in before the step, the result copied back after it),
    fp32 copies are made when ``param_update_in_fp32`` and the parameter is not fp32, and the
    rest stays with the device optimizer. Host buffers are unpinned (no pinned allocator
    without CUDA). Returns the same five mappings as megatron's method.
    """
    self.pin_cpu_grads = self.pin_cpu_params = False
    params = [p for group in self.param_groups for p in group["params"]]
    budget = sum(p.numel() for p in params) * offload_fraction
    offloaded = 0
    cpu_groups, device_groups = [], []
    device_to_host, host_to_device, to_fp32 = {}, {}, {}
    for group in self.param_groups:
        host_params, device_params = [], []
        for param in group["params"]:
            inner, on_host = param, offloaded < budget
            if on_host:
                inner = param.detach().clone()
                offloaded += inner.numel()
            if self.param_update_in_fp32 and inner.dtype != torch.float32:
                inner = inner.detach().clone().float()
                to_fp32[param] = inner
            if on_host:
                device_to_host[param], host_to_device[inner] = inner, param
            (host_params if on_host else device_params).append(inner)
        for members, out in ((device_params, device_groups), (host_params, cpu_groups)):
            if members:
                out.append({**group, "params": members})
    return cpu_groups, device_groups, device_to_host, host_to_device, to_fp32


def patch_hybrid_param_groups() -> bool:
    """``HybridDeviceOptimizer._get_sub_optimizer_param_groups`` -> ``_host_param_groups``.

    Why: megatron-core 0.16.1 offloads only ``param.is_cuda`` parameters; on CPU none is, so
    no host copy is made, every parameter lands in the CPU optimizer unmapped and the first
    ``step()`` raises ``KeyError`` looking up its device parameter (``cpu_copys_map_gpu_param``),
    and ``pin_memory=True`` host buffers raise without CUDA. The twin makes the same copies, so
    ``--optimizer-cpu-offload`` (with ``--use-precision-aware-optimizer``: decoupled grads, fp32
    updates) runs megatron's own step, d2h and h2d hooks on CPU. Can go when megatron offloads
    parameters of any device (not the case up to 0.16.x).
    """
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    if HybridDeviceOptimizer._get_sub_optimizer_param_groups is _host_param_groups:
        return False
    HybridDeviceOptimizer._get_sub_optimizer_param_groups = _host_param_groups
    return True


# what a machine without CUDA needs beyond TE_ABSENT_PATCHES (a CPU machine never has TE)
CPU_PATCHES = {
    "cuda_device_mode": patch_cuda_device_mode,
    "current_device": patch_current_device,
    "cuda_synchronize": patch_cuda_synchronize,
    "rng_tracker": patch_rng_tracker,
    "host_streams": patch_host_streams,
    "hybrid_param_groups": patch_hybrid_param_groups,
}


def apply_cpu_compat() -> dict:
    """Apply ``TE_ABSENT_PATCHES`` then every patch in ``CPU_PATCHES``; returns ``{name: changed}``.

    Call once from backend initialisation when CUDA is absent; safe to call again.
    """
    if torch.cuda.is_available():
        raise RuntimeError("apply_cpu_compat() is for machines without CUDA")
    changed = apply_te_absent_patches()
    changed |= {name: patch() for name, patch in CPU_PATCHES.items()}
    logger.info("megatron CPU compat patches: %s", changed)
    return changed
