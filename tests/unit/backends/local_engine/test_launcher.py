"""The launcher fails fast, with the exit code, when the engine process dies while starting."""

import pytest

from slime.backends.local_engine.launcher import launch_local_engine
from tests.unit.backends.local_engine.conftest import free_port


def test_dead_engine_fails_fast_with_its_exit_code(tmp_path):
    with pytest.raises(RuntimeError, match="exited with code"):
        launch_local_engine(tmp_path / "no_model_here", free_port(), timeout=120, log_path=str(tmp_path / "log"))
