"""Session inputs of the end-to-end tests: the tiny MoE HF checkpoint, the toy data and the
HF checkpoint converted once to torch_dist (the trainer's `--ref-load`)."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.runner import convert_checkpoint


@dataclass(frozen=True)
class E2EInputs:
    """Read-only inputs shared by every run of the session."""

    hf: Path
    data: Path
    torch_dist: Path


@pytest.fixture(scope="session")
def e2e_inputs(tiny_moe_hf, toy_data, tmp_path_factory) -> E2EInputs:
    """The tiny MoE (HF and torch_dist) and the toy task's train/eval data."""
    out = tmp_path_factory.mktemp("e2e_ref") / "torch_dist"
    return E2EInputs(hf=tiny_moe_hf, data=toy_data, torch_dist=convert_checkpoint(tiny_moe_hf, out))
