"""`initialize_megatron` wiring: --distributed-timeout-minutes reaches the default process group and
megatron's groups; --custom-megatron-init-path runs last, with args (slime's call site)."""

import argparse

from slime.backends.megatron_utils import parallel

CALLS = []


def record_init(args):
    """A --custom-megatron-init-path plugin."""
    CALLS.append(("custom_init", args.seed))


def test_timeout_reaches_the_groups_and_the_init_plugin_runs_last(monkeypatch):
    CALLS.clear()
    monkeypatch.setattr(parallel, "init_process_group", lambda **kw: CALLS.append(("process_group", kw["timeout_minutes"])))
    from megatron.core import parallel_state as mpu

    monkeypatch.setattr(mpu, "model_parallel_is_initialized", lambda: False)
    monkeypatch.setattr(mpu, "initialize_model_parallel",
                        lambda **kw: CALLS.append(("model_parallel", kw["distributed_timeout_minutes"])))
    monkeypatch.setattr(parallel, "set_random_seed", lambda seed: CALLS.append(("seed", seed)))
    monkeypatch.setattr(parallel, "apply_upstream_patches", lambda cuda_available: None)
    args = argparse.Namespace(distributed_timeout_minutes=3, seed=7, distributed_backend="gloo",
                              custom_megatron_init_path=f"{__name__}.record_init")
    parallel.initialize_megatron(args)
    assert CALLS == [("process_group", 3), ("model_parallel", 3), ("seed", 7), ("custom_init", 7)]
