"""Named patches that let megatron-core run on a machine without CUDA.

Owns every change we make to megatron-core / torch behaviour for CPU runs. Nothing
is patched at import time: backend initialisation calls ``apply_cpu_compat()`` when
``torch.cuda.is_available()`` is false. Each patch is a small function with a
docstring saying why it is needed, which upstream version needs it and when it can
go; each is idempotent (applying twice is a no-op) and reports whether it changed
anything. Verified against megatron-core 0.16.1 on torch 2.13.0+cpu.
"""

import importlib.util
import logging

import torch

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


def patch_te_general_gemm() -> bool:
    """Define ``moe_utils.te_general_gemm = None`` when Transformer Engine is absent.

    Why: megatron-core 0.16.1 imports ``te_general_gemm`` inside a ``try`` in
    ``transformer/moe/moe_utils.py`` and leaves the name undefined on ImportError, but
    ``router_gating_linear`` tests ``te_general_gemm is not None`` -> NameError in the
    MoE router's forward. ``None`` makes it take its torch fallback. Can go when
    upstream binds the name in the ``except`` branch.
    """
    from megatron.core.transformer.moe import moe_utils

    if hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
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


def patch_mla_have_te() -> bool:
    """``megatron.core.transformer.multi_latent_attention.HAVE_TE`` -> False when Transformer Engine
    is absent.

    Why: megatron-core 0.16.1's MLA module imports ``TELinear`` from
    ``megatron.core.extensions.transformer_engine``, which without TE succeeds and hands back a
    placeholder object, so MLA sets ``HAVE_TE = True`` and its constructor's
    ``isinstance(self.linear_proj, TELinear)`` raises "isinstance() arg 2 must be a type" with
    the local spec (DeepSeek-V3 / Kimi-K2 / Moonlight on CPU). Can go when MLA reads
    ``extensions.transformer_engine.HAVE_TE`` (not the case up to 0.16.x).
    """
    from megatron.core.extensions import transformer_engine as te_ext
    from megatron.core.transformer import multi_latent_attention as mla

    if te_ext.HAVE_TE or not mla.HAVE_TE:
        return False
    mla.HAVE_TE = False
    return True


def patch_torch_adam_state_copy() -> bool:
    """``DistributedOptimizer._set_main_param_and_optimizer_states`` gives torch Adam's ``step``
    the value of the loaded param groups, never the parameter-state file's (no Apex/TE).

    Why: without Apex/TE, megatron-core 0.16.1's ``DistributedOptimizer`` keeps the authoritative
    ``step`` in the param groups (``state_dict`` reads it from the per-parameter states,
    ``load_state_dict`` writes it back into every state before the parameter states load). The
    parameter states then overwrite it: the ``dp_reshardable`` layout (ours) hands back the step
    of the fresh optimizer the load template was built from (1 after the zero-gradient step that
    materialises the state: seen a checkpoint saved at step 2 resume at step 1, so Adam's bias
    correction and every later step differed), and the ``fully_reshardable``,
    ``dp_zero_gather_scatter`` and ``fully_sharded_model_space`` loaders leave it out, which
    raises ``KeyError: 'step'``. So the state's own step (the param groups') is copied onto
    itself. TE/Apex FusedAdam keeps no per-parameter step. Can go when megatron restores the
    per-parameter step from the param groups (not the case up to 0.16.x).
    """
    from megatron.core.optimizer import distrib_optimizer as dopt

    original = dopt.DistributedOptimizer._set_main_param_and_optimizer_states
    if dopt.HAVE_APEX_OR_TE or getattr(original, _MARK, False):
        return False

    def set_states(self, model_param, tensors):
        if not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            step = self.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step}  # copied onto itself: the param groups' step stays
        return original(self, model_param, tensors)

    setattr(set_states, _MARK, True)
    dopt.DistributedOptimizer._set_main_param_and_optimizer_states = set_states
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


def _absent_te_is_older(_version, check_equality: bool = True) -> bool:
    """Stand-in of megatron's ``is_te_min_version`` when Transformer Engine is absent: no
    version is reached."""
    return False


def patch_optimizer_te_version() -> bool:
    """``megatron.core.optimizer.optimizer_config.is_te_min_version`` -> False without TE.

    Why: megatron-core 0.16.1's ``OptimizerConfig.__post_init__`` asks TE's version for every
    ``--use-precision-aware-optimizer`` config (to turn ``store_param_remainders`` off below TE
    2.1, a FusedAdam option) before it returns for ``--optimizer-cpu-offload``, whose
    HybridDeviceOptimizer never uses TE; without TE the comparison raises ``TypeError`` (None >=
    Version). The GPU image has TE, so the MoE recipes' CPU Adam builds there; the stand-in lets the
    same config build on CPU. Can go when megatron checks the version only where FusedAdam is used.
    """
    from megatron.core.optimizer import optimizer_config

    if importlib.util.find_spec("transformer_engine") is not None:
        return False
    if optimizer_config.is_te_min_version is _absent_te_is_older:
        return False
    optimizer_config.is_te_min_version = _absent_te_is_older
    return True


CPU_PATCHES = {
    "mla_have_te": patch_mla_have_te,
    "cuda_device_mode": patch_cuda_device_mode,
    "current_device": patch_current_device,
    "cuda_synchronize": patch_cuda_synchronize,
    "rng_tracker": patch_rng_tracker,
    "te_general_gemm": patch_te_general_gemm,
    "torch_adam_state_copy": patch_torch_adam_state_copy,
    "host_streams": patch_host_streams,
    "hybrid_param_groups": patch_hybrid_param_groups,
    "optimizer_te_version": patch_optimizer_te_version,
}


def apply_cpu_compat() -> dict:
    """Apply every patch in ``CPU_PATCHES``; returns ``{name: changed}``.

    Call once from backend initialisation when CUDA is absent; safe to call again.
    """
    if torch.cuda.is_available():
        raise RuntimeError("apply_cpu_compat() is for machines without CUDA")
    changed = {name: patch() for name, patch in CPU_PATCHES.items()}
    logger.info("megatron CPU compat patches: %s", changed)
    return changed
