"""SGLangEngine lifecycle through the real launch path, with a fake `sglang.launch_server` script:
start-up, health check, the argv and devices the server receives, stopping only its own process
group, and clear errors for a server that exits at once, never answers, or lacks GPUs."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from slime.backends.sglang_utils.engine import SGLangEngine, launch
from slime.utils.arguments import parse_args
from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_ARGS

from slime.utils.misc import free_port
from slime.utils.security import API_KEY_ENV

FAKE_SERVER = Path(__file__).with_name("fake_sglang_server.py")
EIGHT_GPUS = "0,1,2,3,4,5,6,7"


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _wait_gone(pid: int, deadline_s: float = 30.0) -> bool:
    end = time.monotonic() + deadline_s
    while _running(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not _running(pid)


@pytest.fixture
def args():
    return parse_args(QWEN3_30B_A3B_ARGS)


def test_launch_health_argv_and_stop_of_own_group_only(args, tmp_path, monkeypatch, caplog):
    key = "job-key-for-the-fake-server-31"
    monkeypatch.setenv(API_KEY_ENV, key)  # the job's key reaches SGLang by environment, never argv or a log line
    caplog.set_level("INFO")
    record = tmp_path / "record.json"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    engine = None
    try:
        engine = launch(args, engine_rank=0, host="127.0.0.1", port=free_port(), visible_devices=EIGHT_GPUS,
                        log_path=str(tmp_path / "engine.log"), timeout=60, launcher=(sys.executable, str(FAKE_SERVER)),
                        env={"FAKE_SGLANG_RECORD": str(record)})
        assert engine.is_alive()
        assert requests.get(f"{engine.url}/health", timeout=10).status_code == 200
        seen = json.loads(record.read_text())
        assert seen["pid"] == engine.pid
        assert seen["argv"] == engine.command[2:]
        assert seen["cuda_visible_devices"] == EIGHT_GPUS
        assert "--model-path" in seen["argv"] and seen["argv"][seen["argv"].index("--tp-size") + 1] == "8"
        assert seen["api_key_env"] == key and "started SGLang engine" in caplog.text
        assert not any(key in word for word in engine.command) and "--api-key" not in seen["argv"]
        assert key not in caplog.text
        assert engine.stop() is not None
        assert not engine.is_alive() and engine.poll() is not None
        assert _wait_gone(seen["child_pid"]), "the server's child survived stop()"
        assert bystander.poll() is None, "stop() reached a process outside the engine's group"
    finally:
        if engine is not None:
            engine.stop()
        bystander.kill()
        bystander.wait()


def test_server_that_exits_at_once_names_its_exit_code(args, tmp_path):
    log = tmp_path / "engine.log"
    with pytest.raises(RuntimeError, match=r"exited with code 3.*engine\.log"):
        launch(args, engine_rank=0, host="127.0.0.1", port=free_port(), visible_devices=EIGHT_GPUS,
               log_path=str(log), timeout=60, launcher=(sys.executable, "-c", "import sys; sys.exit(3)"))


def test_server_that_dies_names_its_own_error_first(args, tmp_path):
    """The root cause (the engine's last exception line in its log) comes before the exit code."""
    log = tmp_path / "engine.log"
    died = "import sys; print('Traceback (most recent call last):'); print('ValueError: tp_size 8 > 1 GPU'); sys.exit(1)"
    with pytest.raises(RuntimeError, match=r"^SGLang engine failed to start: ValueError: tp_size 8 > 1 GPU; .*exited "
                       r"with code 1"):
        launch(args, engine_rank=0, host="127.0.0.1", port=free_port(), visible_devices=EIGHT_GPUS,
               log_path=str(log), timeout=60, launcher=(sys.executable, "-c", died))


def test_server_that_never_answers_times_out_and_is_stopped(args):
    engine = SGLangEngine({"model_path": "/m", "host": "127.0.0.1", "port": free_port()},
                          launcher=(sys.executable, "-c", "import time; time.sleep(600)"))
    with pytest.raises(TimeoutError, match="not healthy"):
        engine.start(timeout=1)
    assert engine.poll() is not None and not engine.is_alive()


def test_engine_needs_its_gpus_visible(args):
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES='0,1'"):
        launch(args, engine_rank=0, host="127.0.0.1", port=free_port(), visible_devices="0,1",
               launcher=(sys.executable, str(FAKE_SERVER)))
    with pytest.raises(ValueError, match="GPUs 4..11"):
        launch(args, engine_rank=0, host="127.0.0.1", port=free_port(), visible_devices=EIGHT_GPUS,
               base_gpu_id=4, launcher=(sys.executable, str(FAKE_SERVER)))


def test_start_twice_is_refused(tmp_path):
    engine = SGLangEngine({"model_path": "/m", "host": "127.0.0.1", "port": free_port()},
                          launcher=(sys.executable, str(FAKE_SERVER)), env={"FAKE_SGLANG_RECORD": str(tmp_path / "r")})
    engine.start(timeout=60)
    try:
        with pytest.raises(RuntimeError, match="already started"):
            engine.start()
    finally:
        engine.stop()


def test_non_zero_node_rank_does_not_wait_for_http():
    fields = {"model_path": "/m", "host": "127.0.0.1", "port": free_port(), "tp_size": 16, "nnodes": 2,
              "node_rank": 1, "dist_init_addr": "127.0.0.1:5000", "base_gpu_id": 0}
    engine = SGLangEngine(fields, visible_devices=EIGHT_GPUS,
                          launcher=(sys.executable, "-c", "import time; time.sleep(600)"))
    assert not engine.serves_http
    try:
        engine.start(timeout=1)  # would raise TimeoutError if it waited for /health
        assert engine.is_alive()
    finally:
        engine.stop()
    assert not engine.is_alive()


def test_launched_servers_health_endpoint_does_not_generate(args, monkeypatch):
    """SGLang's /health generates a token unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false:
    a fault-tolerance probe would then race /release_memory_occupation (idle only)."""
    from slime.backends.sglang_utils.engine import prepare

    monkeypatch.delenv("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", raising=False)
    engine = prepare(args, engine_rank=0, host="127.0.0.1", port=30000, nccl_port=30001, visible_devices=EIGHT_GPUS)
    assert engine.env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
