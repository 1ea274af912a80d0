"""megatron-core's import under `lean_import`'s two patches: what they defer and hide, that the
deferred torch.compile makes the same call, once, at the first call (with CUDA) or none (without),
and that dynamo traces the router's `@jit_fuser` function, which the CPU runs uncompiled."""

import subprocess
import sys
import textwrap

import torch

from slime.backends.megatron_utils.lean_import import deferred_torch_compile


def test_megatron_imports_without_dynamo_wandb_or_tensorboard_and_torch_compile_is_back():
    """In a fresh interpreter: `import wandb` and `import torch.utils.tensorboard` fail inside
    `hidden_modules` only; megatron-core is imported, torch._dynamo, wandb and tensorboard are
    not, its fused kernels wait for their first call, megatron's timers know no SummaryWriter, and
    afterwards torch.compile, wandb and tensorboard are as usual."""
    code = textwrap.dedent("""
        import sys, torch
        real = torch.compile
        from slime.backends.megatron_utils.lean_import import hidden_modules, import_megatron_core
        with hidden_modules():  # the imports fail inside only
            for hidden in ("import wandb", "from torch.utils.tensorboard import SummaryWriter"):
                try:
                    exec(hidden)
                    raise AssertionError(hidden + " worked inside hidden_modules")
                except ImportError:
                    pass
        # the "missing" markers are gone: a later import looks again
        assert "wandb" not in sys.modules and "torch.utils.tensorboard" not in sys.modules
        import_megatron_core()
        assert "megatron.core" in sys.modules
        assert "torch._dynamo" not in sys.modules, "torch.compile ran during the import"
        assert "wandb" not in sys.modules, "wandb was imported"
        assert "torch.utils.tensorboard" not in sys.modules, "tensorboard was imported"
        from megatron.core import timers
        assert timers.SummaryWriter is None
        assert torch.compile is real
        from megatron.core.fusions.fused_bias_geglu import geglu
        assert geglu.__wrapped__.__name__ == "geglu"  # the deferred wrapper of the original
        import importlib.util
        if importlib.util.find_spec("wandb") is not None:
            import wandb  # hidden during the import only
        if importlib.util.find_spec("tensorboard") is not None:
            from torch.utils.tensorboard import SummaryWriter
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_deferred_compile_makes_the_same_call_once_at_the_first_call(monkeypatch):
    calls = []

    def recording_compile(model=None, **options):
        calls.append((model, options))
        return lambda *a, **k: ("compiled", model(*a, **k))

    monkeypatch.setattr(torch, "compile", recording_compile)

    def double(x):
        return 2 * x

    def triple(x):
        return 3 * x

    with deferred_torch_compile():
        lazy_double = torch.compile(double, dynamic=False)
        lazy_triple = torch.compile(backend="eager")(triple)  # the decorator-factory form
        assert calls == []
    assert torch.compile is recording_compile
    assert lazy_double(4) == ("compiled", 8) and lazy_double(5) == ("compiled", 10)
    assert lazy_triple(2) == ("compiled", 6)
    assert calls == [(double, {"dynamic": False}), (triple, {"backend": "eager"})]
    assert lazy_double.__name__ == "double" and lazy_double.__wrapped__ is double


def test_deferred_compile_passes_modules_to_the_real_compile(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model=None, **options: seen.append(model) or model)
    module = torch.nn.Linear(2, 2)
    with deferred_torch_compile():
        assert torch.compile(module) is module
    assert seen == [module]


def test_without_cuda_the_deferred_function_is_called_uncompiled(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model=None, **options: calls.append(model))

    def double(x):
        return 2 * x

    with deferred_torch_compile(compile_at_first_call=False):
        lazy_double = torch.compile(double, dynamic=False)
    assert lazy_double(4) == 8 and lazy_double(5) == 10
    assert calls == [] and lazy_double.__wrapped__ is double


def test_the_routers_fused_function_runs_without_dynamo_on_cpu_and_dynamo_traces_it():
    """In a fresh CPU interpreter: every routing calls `TopKRouter._apply_expert_bias` (megatron's
    one `@jit_fuser` function on the CPU path); it runs without importing torch._dynamo, and
    dynamo's trace of the original (what a GPU run compiles) gives the same counts with expert
    bias on (DeepSeek-V3's router) and does nothing with it off."""
    code = textwrap.dedent("""
        import sys, types, torch
        from slime.backends.megatron_utils.lean_import import import_megatron_core
        import_megatron_core()
        from megatron.core.transformer.moe.router import TopKRouter

        def router(bias_on):
            return types.SimpleNamespace(enable_expert_bias=bias_on, local_tokens_per_expert=torch.zeros(4))

        routing_map = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
        padding = torch.tensor([[False], [True], [False]])  # a padded token (the second)
        eager = router(True)
        TopKRouter._apply_expert_bias(eager, routing_map, padding)
        assert eager.local_tokens_per_expert.tolist() == [2.0, 1.0, 1.0, 0.0]
        assert "torch._dynamo" not in sys.modules, "the CPU run compiled the router's function"
        traced_fn = torch.compile(TopKRouter._apply_expert_bias.__wrapped__, backend="eager")
        traced, off = router(True), router(False)
        traced_fn(traced, routing_map, padding)
        traced_fn(off, routing_map, None)
        assert torch.equal(traced.local_tokens_per_expert, eager.local_tokens_per_expert)
        assert not off.local_tokens_per_expert.any()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
