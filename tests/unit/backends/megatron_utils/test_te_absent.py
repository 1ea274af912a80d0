"""The patches for absent Transformer Engine / Apex are applied on a CUDA machine too.

On an H100 without TE (2026-11-26) the MoE router's first forward raised ``NameError:
te_general_gemm``: the patch that binds the name was applied with the CPU patches only. Here the
CUDA branch of ``apply_upstream_patches`` runs in a fresh CPU process (TE and Apex are absent, as
on that machine) and must fix what TE's absence breaks, and nothing that CUDA's absence breaks.
"""

import pytest
import torch

from tests.unit.backends.megatron_utils.spawn_util import spawn
from tests.unit.backends.megatron_utils.test_cpu_compat import (
    _fails,
    _fails_with_type_error,
    _recipe_cpu_adam_config,
    _router_gating,
)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the GPU branch on a CPU machine")


def _worker(rank, world_size):
    from slime.backends.megatron_utils.parallel import apply_upstream_patches

    before = {"router": _fails(_router_gating), "adam_config": _fails_with_type_error(_recipe_cpu_adam_config)}
    changed = apply_upstream_patches(cuda_available=True)
    return {"before": before, "changed": changed, "router": _router_gating(),
            "adam_config": _recipe_cpu_adam_config(),
            "cpu_patches_left_out": _fails(torch.cuda.current_device),
            "again": apply_upstream_patches(cuda_available=True)}


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    return spawn(_worker, 1, tmp_path_factory.mktemp("te_absent"))[0]


def test_the_cuda_branch_applies_every_te_absent_patch_once(outcome):
    from slime.backends.megatron_utils.te_absent import TE_ABSENT_PATCHES

    assert set(outcome["changed"]) == set(TE_ABSENT_PATCHES)
    assert outcome["changed"]["te_general_gemm"] and outcome["changed"]["optimizer_te_version"]
    assert not any(outcome["again"].values())


def test_router_and_cpu_adam_config_work_without_te_and_without_the_cpu_patches(outcome):
    assert outcome["before"] == {"router": True, "adam_config": True}, "megatron no longer fails without TE"
    assert outcome["router"] and outcome["adam_config"]
    assert outcome["cpu_patches_left_out"], "the CUDA branch must not apply the CPU patches"


def test_cpu_compat_registries_do_not_overlap():
    from slime.backends.megatron_utils.cpu_compat import CPU_PATCHES
    from slime.backends.megatron_utils.te_absent import TE_ABSENT_PATCHES

    assert not set(CPU_PATCHES) & set(TE_ABSENT_PATCHES)
