"""`import megatron.core` at about a third of its CPU cost: two named patches, active only while the
package imports (`import_megatron_core`). Every process of a job that imports megatron-core (the
driver's config check, each trainer rank) pays for that import during start-up, when the 2 cores of
a small machine are saturated; this is what start-up is made of (docs/performance.md, "Start-up").

Measured with megatron-core 0.16.1 on torch 2.13.0+cpu (CPU seconds of the import after torch):
2.6-2.7 plain, 1.2-1.3 without the first patch's cost, 0.9-1.0 without both, 0.7-0.8 with
tensorboard hidden too.

- `deferred_torch_compile`: `megatron.core.jit` sets `jit_fuser = torch.compile` (torch >= 2.2), so
  every `@jit_fuser` function (the fused bias-GeLU, -GeGLU, -SwiGLU, ... kernels) calls
  `torch.compile` at import, which imports torch._dynamo and parts of torch._inductor. While the
  package imports, `torch.compile(fn, **options)` of a plain function returns a wrapper that makes
  the same `torch.compile(fn, **options)` call at the function's first call and then calls what it
  returned. torch.compile itself compiles nothing before the first call either, so what runs is the
  same; only dynamo's import moves to the first fused call. Anything else (a module, a decorator
  factory's later use) goes to the real torch.compile. Can go if megatron-core decorates lazily.
  Without CUDA the wrapper calls the function itself, uncompiled: there `kernels.Kernels` turns
  the fusions off, and the one `@jit_fuser` function left on the path, the MoE router's
  `TopKRouter._apply_expert_bias` (called by every routing, expert bias or not), made every
  trainer rank import torch._dynamo and torch._inductor and trace it in its first forward (the
  benchmark job's first train step took 1.45 s instead of 0.15 s). Its eager tensor ops compute
  the same; inductor's CPU kernels are not what a GPU runs anyway, and dynamo's trace of it (what
  a GPU run does first) is checked by tests/unit/backends/megatron_utils/test_lean_import.py.
- `hidden_modules`: `megatron.core.inference.contexts.dynamic_context` and `megatron.core.timers`
  import wandb when it is installed, and `megatron.core.timers` imports `torch.utils.tensorboard`
  (tensorboard's stub of TensorFlow: 0.2 CPU-s), for the inference engine's and megatron's own
  timers' logging, neither of which the trainer uses (megatron's `Timers.write` is never called:
  our sinks log). While the package imports, both imports fail as if the packages were absent
  (megatron then records HAVE_WANDB = False, SummaryWriter = None); afterwards they import as
  usual, for `--use-wandb`'s and `--use-tensorboard`'s sinks.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys


@contextlib.contextmanager
def deferred_torch_compile(compile_at_first_call: bool = True):
    """Within the block, `torch.compile` of a plain function compiles at its first call, or with
    `compile_at_first_call` False is never compiled (see the module docstring); the real
    torch.compile is back on leaving."""
    import torch

    real = torch.compile

    def compile_on_first_call(model=None, **options):
        if model is None:  # used as @torch.compile(**options)
            return functools.partial(compile_on_first_call, **options)
        if not inspect.isfunction(model):
            return real(model, **options)
        compiled = None

        @functools.wraps(model)
        def call(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **options) if compile_at_first_call else model
            return compiled(*args, **kwargs)

        return call

    torch.compile = compile_on_first_call
    try:
        yield
    finally:
        torch.compile = real


# what megatron-core imports for logging the trainer does not use (module docstring)
HIDDEN_DURING_IMPORT = ("wandb", "torch.utils.tensorboard")


@contextlib.contextmanager
def hidden_modules(names=HIDDEN_DURING_IMPORT):
    """Within the block, importing any of `names` raises ImportError (except a module already
    imported); leaving it, a later import looks for them again."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # the import system's "known to be missing"
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def import_megatron_core() -> None:
    """Import megatron-core under both patches (its `@jit_fuser` functions compiled at their first
    call with CUDA, never without); a no-op once it is imported. Call it before any other import
    of megatron-core in the process."""
    if "megatron.core" in sys.modules:
        return
    import torch

    with deferred_torch_compile(compile_at_first_call=torch.cuda.is_available()), hidden_modules():
        import megatron.core  # noqa: F401
        import megatron.core.transformer.transformer_config  # noqa: F401 - the fused kernels' modules
