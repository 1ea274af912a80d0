"""Fixtures for the plan tests: the Qwen3-30B-A3B recipe parsed by the real ``parse_args``.

The flags are read from ``scripts/run-qwen3-30B-A3B.sh`` by running it (``recipe_argv``), so the
script and the tests cannot drift apart.
"""

from pathlib import Path

import pytest

from slime.utils.arguments import parse_args
from tests.unit.tools.recipe_argv import recipe_argv

REPO = Path(__file__).resolve().parents[4]

CPU_ADAM_FLAGS = ("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d")


@pytest.fixture(scope="session")
def qwen3_recipe_argv(tmp_path_factory):
    """The flags ``scripts/run-qwen3-30B-A3B.sh --dry-run`` hands train.py, verbatim (MODEL_DIR
    /nonexistent: every file is missing, a dry-run warning)."""
    return recipe_argv(REPO, "run-qwen3-30B-A3B.sh", tmp_path_factory.mktemp("recipe"), MODEL_DIR="/nonexistent")[1]


@pytest.fixture
def qwen3_args(qwen3_recipe_argv):
    """Parsed args of the recipe; ``drop`` removes flags, ``extra`` appends flags (variants of the
    shipped recipe for the plan's arithmetic)."""

    def make(drop=(), extra=()):
        return parse_args([a for a in qwen3_recipe_argv if a not in drop] + list(extra))

    return make
