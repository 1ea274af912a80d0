"""Set-up of the checks that import a real sglang release (see ../test_sglang_releases.py).

sglang imports torchvision at load (multimodal configs). The only torchvision wheel for torch
2.13 is a CUDA build: its compiled library cannot load beside the CPU torch, and its meta-kernel
registrations then fail on two operators that the library would have defined. Declaring those two
operator schemas first lets its pure-Python part import; nothing here calls a torchvision op.
"""

import os

import pytest
import torch


def declare_torchvision_ops() -> torch.library.Library:
    """Define the schemas of torchvision::nms and ::qnms (what its CUDA library would register)."""
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    return lib


_TORCHVISION_OPS = pytest.StashKey[torch.library.Library]()


def pytest_configure(config):
    config.stash[_TORCHVISION_OPS] = declare_torchvision_ops()  # the schemas live as long as the library
    import sglang

    want = os.environ.get("SLIME_SGLANG_VERSION")
    if want and sglang.__version__ != want:
        raise pytest.UsageError(f"expected sglang {want} on PYTHONPATH, imported {sglang.__version__} "
                                f"from {sglang.__file__}")


@pytest.fixture(scope="session")
def sglang_version() -> str:
    """The version of the sglang release under test, e.g. "0.5.23"."""
    import sglang

    return sglang.__version__
