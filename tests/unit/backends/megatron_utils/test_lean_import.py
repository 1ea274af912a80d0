"""megatron-core's import under `lean_import`'s two patches: what they defer and hide, and that the
deferred torch.compile makes the same call, once, at the first call."""

import subprocess
import sys
import textwrap

import torch

from slime.backends.megatron_utils.lean_import import deferred_torch_compile


def test_megatron_imports_without_dynamo_or_wandb_and_torch_compile_is_back():
    """In a fresh interpreter: `import wandb` fails inside `hidden_wandb` only; megatron-core is
    imported, torch._dynamo and wandb are not, its fused kernels wait for their first call, and
    afterwards torch.compile and wandb are as usual."""
    code = textwrap.dedent("""
        import sys, torch
        real = torch.compile
        from slime.backends.megatron_utils.lean_import import hidden_wandb, import_megatron_core
        with hidden_wandb():  # `import wandb` fails inside only
            try:
                import wandb
                raise AssertionError("wandb imported inside hidden_wandb")
            except ImportError:
                pass
        assert "wandb" not in sys.modules  # the "missing" marker is gone: a later import looks again
        import_megatron_core()
        assert "megatron.core" in sys.modules
        assert "torch._dynamo" not in sys.modules, "torch.compile ran during the import"
        assert "wandb" not in sys.modules, "wandb was imported"
        assert torch.compile is real
        from megatron.core.fusions.fused_bias_geglu import geglu
        assert geglu.__wrapped__.__name__ == "geglu"  # the deferred wrapper of the original
        import importlib.util
        if importlib.util.find_spec("wandb") is not None:
            import wandb  # hidden during the import only
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
