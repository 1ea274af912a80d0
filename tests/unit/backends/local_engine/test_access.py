"""The local engine's access rules over real HTTP (one engine started as the Ray job starts it: key
by environment, the job's folders, the trainer's address), and sglang-router 0.3.2 in front of it
with the same key: no key -> 401 and nothing changes; a folder or rendezvous host outside the job's
is refused with a message naming it."""

import os
import shutil

import pytest
import requests

from slime.backends.local_engine.launcher import launch_local_engine, stop_local_engine
from slime.utils.engine_client import EngineHTTPError, SyncEngineClient
from slime.utils.security import API_KEY_ENV
from tests.unit.backends.local_engine.conftest import free_port

KEY = "test-job-key-5f2c9a"
PROMPT = [3, 14, 15, 92, 65]
GREEDY = {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 6}}


@pytest.fixture(scope="module")
def guarded(tiny_moe_hf, tmp_path_factory):
    """(engine url, the job's folder holding a copy of the checkpoint); the engine needs KEY."""
    job = tmp_path_factory.mktemp("job")
    shutil.copytree(tiny_moe_hf, job / "weights")
    port = free_port()
    log = tmp_path_factory.mktemp("engine_log") / "engine.log"
    proc = launch_local_engine(tiny_moe_hf, port, extra_args=("--num-threads", "1"), timeout=120, log_path=str(log),
                               api_key=KEY, weight_dirs=[job], group_hosts=["127.0.0.1"])
    try:
        yield f"http://127.0.0.1:{port}", job
    finally:
        stop_local_engine(proc)
    assert KEY not in log.read_text(errors="replace")


def _state(url):
    client = SyncEngineClient(url, api_key=KEY)
    info = client.get_server_info()
    return client.get_weight_version(), info["paused"], info["released"], client.generate(GREEDY)["output_ids"]


# Every kind of endpoint the job calls, with a body that would succeed (or start work) if allowed.
UNAUTHORIZED_CALLS = [
    ("POST", "/generate", GREEDY),
    ("POST", "/update_weights_from_disk", {"model_path": "WEIGHTS", "weight_version": "attacker"}),
    ("POST", "/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                            "world_size": 2, "group_name": "g"}),
    ("POST", "/update_weights_from_tensor", {"serialized_named_tensors": ["x"]}),
    ("POST", "/pause_generation", {"mode": "abort"}),
    ("POST", "/release_memory_occupation", {}),
    ("POST", "/abort_request", {"abort_all": True}),
    ("GET", "/flush_cache", None),
    ("GET", "/model_info", None),
    ("GET", "/server_info", None),
]


def test_requests_without_the_key_get_401_and_change_nothing(guarded):
    url, job = guarded
    before = _state(url)
    assert requests.get(f"{url}/health", timeout=10).status_code == 200  # probes stay open, as in SGLang
    for method, path, body in UNAUTHORIZED_CALLS:
        if body and body.get("model_path") == "WEIGHTS":
            body = {**body, "model_path": str(job / "weights")}
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": KEY}):
            resp = requests.request(method, f"{url}{path}", json=body, headers=headers, timeout=30)
            assert resp.status_code == 401, (path, headers, resp.text)
            assert resp.json() == {"error": "Unauthorized"}
    assert _state(url) == before  # same version, not paused, not released, same greedy output


def test_disk_updates_only_from_the_jobs_folders(guarded, tiny_moe_hf):
    url, job = guarded
    client = SyncEngineClient(url, api_key=KEY)
    version = client.get_weight_version()
    os.symlink(tiny_moe_hf, job / "link_out")
    for outside in (str(tiny_moe_hf), str(job / ".." / os.path.basename(tiny_moe_hf)), str(job / "link_out")):
        with pytest.raises(EngineHTTPError) as err:
            client.update_weights_from_disk(outside, weight_version="outside")
        assert err.value.status == 400 and outside in err.value.body and "outside the job's folders" in err.value.body
    assert client.get_weight_version() == version
    client.update_weights_from_disk(str(job / "weights"), weight_version="inside")
    assert client.get_weight_version() == "inside"


def test_rendezvous_only_towards_the_trainer(guarded):
    url, _ = guarded
    with pytest.raises(EngineHTTPError) as err:
        SyncEngineClient(url, api_key=KEY).init_weights_update_group("10.11.12.13", 29999, 1, 2, "g", "gloo")
    assert err.value.status == 400 and "'10.11.12.13'" in err.value.body and "trainer addresses" in err.value.body


def test_router_requires_the_key_and_passes_it_on(guarded, monkeypatch, tmp_path):
    pytest.importorskip("sglang_router")
    from slime.backends.sglang_utils.router import RouterProcess, add_worker, list_workers

    url, _ = guarded
    monkeypatch.setenv(API_KEY_ENV, KEY)  # as in a job: the router and its callers read the job's key
    router = RouterProcess("127.0.0.1", free_port(), log_path=tmp_path / "router.log").start()
    try:
        assert not any(KEY in word for word in router.command)  # by environment: on no command line
        assert not any(KEY in word for word in _cmdline(router.process.pid))
        assert router.command[router.command.index("--prometheus-host") + 1] == "127.0.0.1"  # its metrics too
        add_worker(router.url, url)
        assert list_workers(router.url) == [url]
        assert requests.post(f"{router.url}/generate", json=GREEDY, timeout=30).status_code == 401
        assert requests.get(f"{router.url}/workers", timeout=30).status_code == 401
        via_router = SyncEngineClient(router.url).generate(GREEDY)  # key from $SLIME_API_KEY
        assert via_router["output_ids"] == SyncEngineClient(url).generate(GREEDY)["output_ids"]
        # sglang-router 0.3.2 serves these without the key, whatever its flags (--control-plane-api-keys
        # and --jwt-* guard only /workers and the like; docs/security.md says what each shows, and why
        # the router binds loopback on any cluster); every other route needs it
        for path in ROUTER_OPEN_PATHS:
            assert requests.get(f"{router.url}{path}", timeout=30).status_code == 200, path
        # the engines' /metrics relayed (the local engine serves none: 500; SGLang's is open anyway)
        assert requests.get(f"{router.url}/engine_metrics", timeout=30).status_code != 401
        for path in ("/get_model_info", "/get_loads", "/workers", "/flush_cache", "/v1/responses/r",
                     "/v1/tokenizers", "/ha/status", "/wasm"):
            for headers in ({}, {"Authorization": "Bearer wrong-key"}):
                assert requests.get(f"{router.url}{path}", headers=headers, timeout=30).status_code == 401, path
        for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/rerank",
                     "/parse/reasoning", "/parse/function_call"):
            assert requests.post(f"{router.url}{path}", json={}, timeout=30).status_code == 401, path
        # no wildcard CORS: a page of another origin may not read the router's answers
        evil = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
        assert "access-control-allow-origin" not in requests.options(f"{router.url}/generate", headers=evil,
                                                                     timeout=30).headers
        assert "access-control-allow-origin" not in requests.get(f"{router.url}/health", headers=evil,
                                                                 timeout=30).headers
    finally:
        router.stop()


ROUTER_OPEN_PATHS = ("/health", "/liveness", "/readiness", "/health_generate", "/v1/models", "/get_server_info")


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().decode(errors="replace").split("\0")
