"""A scheduler step that raises makes the engine visibly unhealthy instead of hanging its clients.

The engine runs in this process (uvicorn in a thread) so the test can replace the model's forward
with one that raises on a chosen call: in the prefill (a request being admitted) or in a decode
step (one request running, one waiting). Every request in flight must end with HTTP 500 and the
cause, `/health` and `/health_generate` must answer 503, and a new `/generate` must be refused
with 503 at once.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from slime.backends.local_engine.engine import Engine, EngineConfig
from slime.backends.local_engine.server import build_app
from slime.utils.misc import free_port

pytestmark = pytest.mark.timeout(180)

TIMEOUT = 60  # seconds a client waits; an engine hanging its requests fails the test here


@pytest.fixture
def serve(tiny_moe_hf):
    """`serve() -> (engine, base_url)`: an in-process engine with max one running request."""
    import uvicorn

    started = []

    def start():
        engine = Engine(EngineConfig(model_path=str(tiny_moe_hf), max_running_requests=1, context_length=256))
        engine.start()
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(build_app(engine), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        started.append((engine, server, thread))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    return engine, url
            except requests.ConnectionError:
                time.sleep(0.1)
        raise TimeoutError("in-process engine did not come up")

    yield start
    for engine, server, thread in started:
        server.should_exit = True
        thread.join(timeout=10)
        engine.stop()


def _fail_forward_at(model, call: int) -> None:
    """From now on, the `call`-th forward of `model` (1-based) raises. Counted at the input
    embedding, where every forward starts: the HF forward (prefill) and the engine's own decode step."""
    embedding = model.get_input_embeddings()
    real, count = embedding.forward, [0]

    def forward(*args, **kwargs):
        count[0] += 1
        if count[0] == call:
            raise RuntimeError("injected forward failure")
        return real(*args, **kwargs)

    embedding.forward = forward


def _generate(url, prompt):
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 16, "ignore_eos": True, "temperature": 0}}
    return requests.post(f"{url}/generate", json=body, timeout=TIMEOUT)


def _wait_waiting(url, count):
    deadline = time.monotonic() + TIMEOUT
    while requests.get(f"{url}/get_server_info", timeout=5).json()["waiting"] < count:
        assert time.monotonic() < deadline, "requests were not queued"
        time.sleep(0.05)


# call 1 is the first request's prefill (it is being admitted); call 3 its second decode step
# (it is running, the other request waits behind max_running_requests=1).
@pytest.mark.parametrize("failing_call", [1, 3], ids=["in_prefill", "in_decode"])
def test_failed_step_ends_requests_with_errors_and_health_fails(serve, failing_call):
    engine, url = serve()
    assert _generate(url, [5, 9, 13]).status_code == 200  # healthy before
    requests.post(f"{url}/pause_generation", json={}, timeout=5).raise_for_status()
    with ThreadPoolExecutor(2) as pool:
        pending = [pool.submit(_generate, url, p) for p in ([5, 9, 13], [20, 21, 22, 23])]
        _wait_waiting(url, 2)
        _fail_forward_at(engine.model, failing_call)
        requests.post(f"{url}/continue_generation", json={}, timeout=5).raise_for_status()
        answers = [f.result() for f in pending]
    for answer in answers:
        assert answer.status_code == 500
        assert "injected forward failure" in answer.json()["error"]["message"]
    for path in ("/health", "/health_generate"):
        answer = requests.get(f"{url}{path}", timeout=TIMEOUT)
        assert answer.status_code == 503 and "injected forward failure" in answer.json()["message"]
    refused = _generate(url, [7, 8])
    assert refused.status_code == 503 and "unhealthy" in refused.json()["error"]["message"]
    assert engine.scheduler.load() == {"waiting": 0, "running": 0}
