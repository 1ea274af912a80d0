"""Session inputs of the end-to-end tests: the tiny MoE HF checkpoint, the toy data and the
HF checkpoint converted once to torch_dist (the trainer's `--ref-load`)."""

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class E2EInputs:
    """Read-only inputs shared by every run of the session."""

    hf: Path
    data: Path
    torch_dist: Path


@pytest.fixture(scope="session")
def e2e_inputs(tiny_moe_hf, tiny_moe_torch_dist, toy_data) -> E2EInputs:
    """The tiny MoE (HF and torch_dist) and the toy task's train/eval data."""
    return E2EInputs(hf=tiny_moe_hf, data=toy_data, torch_dist=tiny_moe_torch_dist)
