"""The launcher fails fast, with the exit code, when the engine process dies while starting."""

import pytest

from slime.backends.local_engine.launcher import launch_local_engine
from tests.unit.backends.local_engine.conftest import free_port


def test_dead_engine_fails_fast_with_its_exit_code(tmp_path):
    with pytest.raises(RuntimeError, match="exited with code"):
        launch_local_engine(tmp_path / "no_model_here", free_port(), timeout=120, log_path=str(tmp_path / "log"))


def test_wait_until_healthy_times_out_without_a_server():
    from slime.utils.engine_client import SyncEngineClient, wait_until_healthy

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TimeoutError, match="not healthy"):
        wait_until_healthy(url, timeout=0.5, interval=0.1)
    assert SyncEngineClient(url).health() is False
