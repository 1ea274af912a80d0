"""The sglang modules the conformance checks rely on import on this CPU machine."""

import importlib

import pytest

MODULES = ["sglang.srt.server_args", "sglang.srt.utils.common", "sglang.srt.managers.io_struct",
           "sglang.srt.weight_sync.tensor_bucket"]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    assert importlib.import_module(name) is not None
