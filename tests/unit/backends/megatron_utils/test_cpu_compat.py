"""Each CPU patch: megatron-core 0.16.1 fails without it, works with it, applying is idempotent.

All checks run in one spawned process (the patches are process-wide); each test reads
its part of the result.
"""

import pytest
import torch

from tests.unit.backends.megatron_utils.spawn_util import spawn

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only patches")


def _fails(fn) -> bool:
    try:
        fn()
    except (AssertionError, RuntimeError, NameError):
        return True
    return False


def _rng_fork_draw():
    from megatron.core.tensor_parallel import random as mp_random

    tracker = mp_random.get_cuda_rng_tracker()
    torch.manual_seed(7)
    tracker.states_["slime-test"] = torch.get_rng_state()
    torch.manual_seed(123)
    with tracker.fork("slime-test"):
        inside = torch.rand(3)
    outside = torch.rand(3)
    torch.manual_seed(7)
    expected_inside = torch.rand(3)
    torch.manual_seed(123)
    expected_outside = torch.rand(3)
    return torch.equal(inside, expected_inside) and torch.equal(outside, expected_outside)


def _fails_with_key_error(fn) -> bool:
    try:
        fn()
    except (KeyError, RuntimeError):
        return True
    return False


def _fails_with_type_error(fn) -> bool:
    try:
        fn()
    except TypeError:
        return True
    return False


def _router_gating():
    from megatron.core.transformer.moe import moe_utils

    inp, weight = torch.randn(5, 8), torch.randn(4, 8)
    out = moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    return torch.allclose(out, inp @ weight.t())


def _device_mode_checks():
    from megatron.core.transformer.utils import get_default_causal_mask

    param = torch.nn.Parameter(torch.zeros(2))
    mask = get_default_causal_mask(3)
    return {
        "zeros": torch.zeros(2, device="cuda").device.type == "cpu",
        "dot_cuda": param.cuda() is param,
        "type_name": param.type() == "torch.cuda.FloatTensor",
        "to_cuda": torch.ones(1).to("cuda").device.type == "cpu",
        "mask": mask.device.type == "cpu" and mask.tolist() == torch.ones(3, 3).triu(1).bool().tolist(),
        "other_types_untouched": torch.zeros(1, dtype=torch.long).type() == "torch.LongTensor",
    }


def _hybrid_adam_step(overlap: bool):
    """One megatron HybridDeviceOptimizer step (CPU AdamW, everything offloaded, fp32 updates) on a
    bf16 parameter with a decoupled grad, as the distributed optimizer hands it over with
    --use-precision-aware-optimizer; returns whether the parameter moved as torch's AdamW on the
    fp32 copy moves it."""
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(4, 3).bfloat16())
    param.decoupled_grad = torch.randn(4, 3)
    reference = torch.nn.Parameter(param.detach().float().clone())
    reference.grad = param.decoupled_grad.clone()
    hyper = dict(lr=0.1, weight_decay=0.1, betas=(0.9, 0.98), eps=1e-8)
    opt = HybridDeviceOptimizer([param], offload_fraction=1.0, cpu_optimizer_cls=torch.optim.AdamW,
                                gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True,
                                overlap_cpu_optimizer_d2h_h2d=overlap, **hyper)
    opt.step()
    torch.optim.AdamW([reference], **hyper).step()
    return torch.equal(param.detach(), reference.detach().bfloat16()) and not torch.equal(
        param.detach().float(), reference.grad)


def _recipe_cpu_adam_config():
    """slime's OptimizerConfig of the MoE recipes' CPU Adam (precision-aware, offloaded)."""
    import argparse

    from slime.backends.megatron_utils.config import optimizer_config_from_args
    from tests.unit.backends.megatron_utils.test_config import QWEN3_30B_A3B

    return optimizer_config_from_args(argparse.Namespace(**QWEN3_30B_A3B)).use_precision_aware_optimizer


def _worker(rank, world_size):
    from megatron.core.transformer.utils import get_default_causal_mask

    from slime.backends.megatron_utils.cpu_compat import apply_cpu_compat

    before = {
        "current_device": _fails(torch.cuda.current_device),
        "cuda_synchronize": _fails(torch.cuda.synchronize),
        "rng_tracker": _fails(_rng_fork_draw),
        "te_general_gemm": _fails(_router_gating),
        "cuda_device_mode": _fails(lambda: torch.zeros(1, device="cuda"))
        and _fails(lambda: get_default_causal_mask(3)),
        "host_streams": _fails(torch.cuda.current_stream) and _fails(torch.cuda.Stream),
        # after the stream stand-ins, so only the parameter grouping is missing
        "hybrid_param_groups": None,
        "optimizer_te_version": _fails_with_type_error(_recipe_cpu_adam_config),
    }
    from slime.backends.megatron_utils.cpu_compat import patch_host_streams

    streams_first = patch_host_streams()
    before["hybrid_param_groups"] = _fails_with_key_error(lambda: _hybrid_adam_step(True))
    first = {**apply_cpu_compat(), "host_streams": streams_first}
    after = {
        "current_device": torch.cuda.current_device() == torch.device("cpu"),
        "cuda_synchronize": torch.cuda.synchronize() is None,
        "rng_tracker": _rng_fork_draw(),
        "te_general_gemm": _router_gating(),
        "cuda_device_mode": _device_mode_checks(),
        "host_streams": torch.cuda.current_stream().record_event().synchronize() is None,
        "hybrid_param_groups": _hybrid_adam_step(True) and _hybrid_adam_step(False),
        "optimizer_te_version": _recipe_cpu_adam_config(),
    }
    return {"before": before, "first": first, "after": after, "second": apply_cpu_compat()}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    return spawn(_worker, 1, tmp_path_factory.mktemp("cpu_compat"))[0]


PATCHES = ["current_device", "cuda_synchronize", "rng_tracker", "te_general_gemm", "cuda_device_mode",
           "host_streams", "hybrid_param_groups", "optimizer_te_version"]


@pytest.mark.parametrize("name", PATCHES)
def test_patch_is_needed_and_applied_once(outcome, name):
    assert outcome["before"][name], f"{name}: megatron no longer fails without the patch; drop it"
    assert outcome["first"][name] is True
    assert outcome["second"][name] is False


def test_current_device_is_cpu(outcome):
    assert outcome["after"]["current_device"]


def test_cuda_synchronize_is_a_no_op(outcome):
    assert outcome["after"]["cuda_synchronize"]


def test_rng_tracker_forks_cpu_state_and_restores(outcome):
    assert outcome["after"]["rng_tracker"]


def test_router_gating_linear_falls_back_to_torch(outcome):
    assert outcome["after"]["te_general_gemm"]


def test_cuda_device_mode_maps_to_cpu(outcome):
    assert outcome["after"]["cuda_device_mode"] == {
        "zeros": True, "dot_cuda": True, "type_name": True, "to_cuda": True, "mask": True,
        "other_types_untouched": True,
    }


def test_host_streams_order_nothing(outcome):
    assert outcome["after"]["host_streams"]


def test_hybrid_cpu_adam_steps_like_torch_adamw(outcome):
    """--optimizer-cpu-offload --use-precision-aware-optimizer on CPU: megatron's own
    HybridDeviceOptimizer step matches torch's AdamW on the fp32 copy, with and without
    --overlap-cpu-optimizer-d2h-h2d."""
    assert outcome["after"]["hybrid_param_groups"]


def test_recipe_cpu_adam_config_builds_without_te(outcome):
    """megatron-core reads TE's version for a precision-aware OptimizerConfig even with CPU offload
    (TypeError without TE); with the stand-in the MoE recipes' config builds on CPU."""
    assert outcome["after"]["optimizer_te_version"]
