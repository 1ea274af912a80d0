"""Fixtures for the argument tests: a minimal valid command line around a real (empty) HF dir."""

import pytest


@pytest.fixture
def base_argv(tmp_path):
    """A small valid train command line: 1 node x 2 GPUs, colocated, 4 prompts x 2 samples."""
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    return [
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--colocate",
        "--hf-checkpoint", str(hf_dir), "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
        "--num-rollout", "3",
    ]
