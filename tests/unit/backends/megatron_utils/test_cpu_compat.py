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
    }
    first = apply_cpu_compat()
    after = {
        "current_device": torch.cuda.current_device() == torch.device("cpu"),
        "cuda_synchronize": torch.cuda.synchronize() is None,
        "rng_tracker": _rng_fork_draw(),
        "te_general_gemm": _router_gating(),
        "cuda_device_mode": _device_mode_checks(),
    }
    return {"before": before, "first": first, "after": after, "second": apply_cpu_compat()}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    return spawn(_worker, 1, tmp_path_factory.mktemp("cpu_compat"))[0]


PATCHES = ["current_device", "cuda_synchronize", "rng_tracker", "te_general_gemm", "cuda_device_mode"]


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
