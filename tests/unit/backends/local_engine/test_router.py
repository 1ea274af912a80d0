"""The local engine behind sglang-router 0.3.2: registered, healthy, and /generate routed to it with
SGLang's default fields filled in by the router."""

import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from slime.backends.sglang_utils.router import list_workers
from slime.utils.engine_client import wait_until_healthy
from tests.unit.backends.local_engine.conftest import free_port

pytest.importorskip("sglang_router")


@pytest.fixture(scope="module")
def router_url(engine_factory, tiny_moe_hf, tmp_path_factory):
    engine_url = engine_factory(tiny_moe_hf)
    port = free_port()
    log = open(tmp_path_factory.mktemp("router") / "router.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", engine_url,
                             "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port())],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", timeout=60, process=proc)
        deadline = time.monotonic() + 60  # /health can answer before --worker-urls is registered
        while engine_url not in list_workers(f"http://127.0.0.1:{port}"):
            assert time.monotonic() < deadline, f"the router never listed {engine_url}"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", engine_url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        log.close()


def test_generate_through_the_router_equals_direct(router_url):
    router, engine = router_url
    assert engine in requests.get(f"{router}/workers", timeout=10).text
    body = {"input_ids": [4, 8, 15, 16, 23, 42], "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 6}}
    via_router = requests.post(f"{router}/generate", json=body, timeout=60)
    direct = requests.post(f"{engine}/generate", json=body, timeout=60)
    assert via_router.status_code == 200, via_router.text
    assert via_router.json()["output_ids"] == direct.json()["output_ids"]
    assert len(via_router.json()["meta_info"]["output_token_logprobs"]) == 6
