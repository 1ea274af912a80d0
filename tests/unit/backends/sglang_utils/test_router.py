"""sglang-router as we start it leaves engine health to us: a worker whose /generate fails many
times in a row (its circuit would open) and whose /health fails (the router's checker would mark
it unhealthy) still gets the next request, instead of `503 no_available_workers`."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from slime.backends.sglang_utils.router import RouterError, RouterProcess, add_worker, router_command

pytest.importorskip("sglang_router")

FAILURES = 25  # more than the router's circuit-breaker threshold (10), counting its own retries


class _FlakyWorker(BaseHTTPRequestHandler):
    """/health 200 until `sick` is set, then 503; /generate 500 for the first FAILURES calls."""

    state = {"generate": 0, "sick": False}

    def do_GET(self):  # noqa: N802 - http.server naming
        ok = self.path.startswith("/health") and not self.state["sick"]
        self._answer(200 if ok else 503, {})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.state["generate"] += 1
        if self.state["generate"] <= FAILURES:
            self._answer(500, {"error": "engine hiccup"})
        else:
            self._answer(200, {"text": "ok", "output_ids": [1], "meta_info": {"finish_reason": {"type": "stop"}}})

    def _answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_router_command_turns_its_circuit_breaker_and_health_checks_off():
    cmd = router_command("127.0.0.1", 30000, extra=["--request-timeout-secs", "7200"])
    assert "--disable-circuit-breaker" in cmd and "--disable-health-check" in cmd
    assert cmd[cmd.index("--request-timeout-secs") + 1] == "7200"
    assert router_command("127.0.0.1", 1, extra=["--disable-health-check"]).count("--disable-health-check") == 1


def test_failing_worker_keeps_getting_requests(tmp_path):
    worker = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyWorker)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    worker_url = f"http://127.0.0.1:{worker.server_address[1]}"
    from slime.utils.misc import free_port

    # fast health checks, so that with them on the worker would be dropped within the test
    router = RouterProcess("127.0.0.1", free_port(), log_path=tmp_path / "router.log",
                           extra=["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]).start()
    try:
        add_worker(router.url, worker_url)
        _FlakyWorker.state["sick"] = True
        answers = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            resp = requests.post(f"{router.url}/generate", json={"input_ids": [1, 2]}, timeout=30)
            answers.append(resp.status_code)
            if resp.status_code == 200:
                break
            time.sleep(0.1)
        assert answers[-1] == 200, f"router answers {answers}: {resp.text[:300]}"
        assert _FlakyWorker.state["generate"] > FAILURES
    finally:
        router.stop()
        worker.shutdown()


def test_a_router_that_exits_while_starting_says_why_and_its_temporary_log_goes_on_stop():
    """Without a log path the router's output was discarded, so a router that died at start (on a
    GPU machine: a package missing) left no reason anywhere. Now its own last line is in the error."""
    from slime.utils.misc import free_port

    router = RouterProcess("127.0.0.1", free_port(), extra=["--no-such-router-flag"])
    with pytest.raises(RouterError, match=r"unrecognized arguments: --no-such-router-flag.*exited with code 2") as err:
        router.start(timeout=60)
    assert str(router.log_path) in str(err.value) and router.log_path.is_file()
    router.stop()
    assert not router.log_path.exists()
