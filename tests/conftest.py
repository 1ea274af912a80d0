"""Shared pytest fixtures: the repository root, tiny Qwen3 / DeepSeek-V3 / GLM-4.5 checkpoints (the
tiny MoE also as torch_dist) and the toy task data.

The checkpoints and data are built once per session by the functions in tools/make_tiny_model.py
and tools/make_toy_data.py (loaded by file path: tools/ is not a package), the torch_dist copy by
tools/convert_hf_to_torch_dist.py. Treat the returned folders as read-only; copy them before
changing anything.
"""

import importlib.util
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def load_tool(name: str):
    """Import tools/<name>.py by path and return the module."""
    path = REPO_ROOT / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"slime_tools_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test leaves the process environment as it found it: code under test sets variables
    process-wide (the job's API key and token, a local Ray's settings), which changed the outcome
    of later tests depending on their order (a router answering 401, a Ray script seeing a
    setting). Session fixtures are set up before this snapshot, so what they set stays."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """Path of the repository root."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_moe_hf(tmp_path_factory) -> Path:
    """Path of a tiny Qwen3MoeForCausalLM Hugging Face checkpoint (seed 0), made once a session."""
    out = tmp_path_factory.mktemp("tiny_moe_hf")
    return load_tool("make_tiny_model").make_tiny_model(out, variant="moe", seed=0)


@pytest.fixture(scope="session")
def tiny_moe_torch_dist(tiny_moe_hf, tmp_path_factory) -> Path:
    """`tiny_moe_hf` converted to torch_dist (tools/convert_hf_to_torch_dist.py, one rank, the flags
    of scripts/models/qwen3-tiny-moe.sh): a trainer's `--ref-load`, made once a session."""
    from tests.e2e.runner import convert_checkpoint

    return convert_checkpoint(tiny_moe_hf, tmp_path_factory.mktemp("tiny_moe_torch_dist") / "torch_dist")


@pytest.fixture(scope="session")
def tiny_dense_hf(tmp_path_factory) -> Path:
    """Path of a tiny dense Qwen3ForCausalLM Hugging Face checkpoint (seed 0), made once a session."""
    out = tmp_path_factory.mktemp("tiny_dense_hf")
    return load_tool("make_tiny_model").make_tiny_model(out, variant="dense", seed=0)


@pytest.fixture(scope="session")
def tiny_deepseek_v3_hf(tmp_path_factory) -> Path:
    """Path of a tiny DeepseekV3ForCausalLM (MLA, YaRN, group routing, shared expert) checkpoint (seed 0)."""
    out = tmp_path_factory.mktemp("tiny_deepseek_v3_hf")
    return load_tool("make_tiny_model").make_tiny_model(out, variant="deepseek_v3", seed=0)


@pytest.fixture(scope="session")
def tiny_glm4_moe_hf(tmp_path_factory) -> Path:
    """Path of a tiny Glm4MoeForCausalLM (QKV bias, QK norm, partial rotary, shared expert) checkpoint (seed 0)."""
    out = tmp_path_factory.mktemp("tiny_glm4_moe_hf")
    return load_tool("make_tiny_model").make_tiny_model(out, variant="glm4_moe", seed=0)


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    """Path of a folder with the toy task's train.jsonl (256 rows) and eval.jsonl (held-out prompts)."""
    out = tmp_path_factory.mktemp("toy_data")
    return load_tool("make_toy_data").make_toy_data(out, seed=0, num_train=256)


@pytest.fixture(scope="session")
def tiny_moe_fp8_hf(tmp_path_factory) -> Path:
    """Path of the tiny MoE checkpoint (seed 0) stored block-FP8 ([32, 32] blocks), made once a session."""
    out = tmp_path_factory.mktemp("tiny_moe_fp8_hf")
    tool = load_tool("make_tiny_model")
    return tool.make_tiny_model(out, variant="moe", seed=0, fp8_block_size=tool.FP8_BLOCK_SIZE)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip where CUDA is absent (they run on a machine with a GPU), and tests
    marked `te` where Transformer Engine is (a GPU machine may lack it: seen on an H100)."""
    import importlib.util

    import torch

    missing = {"gpu": None if torch.cuda.is_available() else "needs CUDA (marked gpu)",
               "te": None if importlib.util.find_spec("transformer_engine") else "needs Transformer Engine (marked te)"}
    for item in items:
        for marker, reason in missing.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
