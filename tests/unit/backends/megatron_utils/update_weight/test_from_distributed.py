"""UpdateWeightFromDistributed.disconnect when an engine is gone (fault tolerance restarted it
elsewhere) or no longer knows the group: the engine is skipped, and our side of the group is
destroyed (backend down, rank 0's TCPStore closed and its port free), so a fresh connect works."""

import datetime
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch.distributed as dist

from slime.backends.megatron_utils.update_weight.from_distributed import UpdateWeightFromDistributed
from slime.utils.misc import free_port
from slime.utils.weight_transport import init_weight_update_group


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


class _Forgetful(BaseHTTPRequestHandler):
    """An engine restarted at the same address: it answers, but has no such group (SGLang's 400)."""

    def do_POST(self):  # noqa: N802 - http.server naming
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"success": False, "message": "The group to be destroyed does not exist."}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def forgetful_engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forgetful)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _port_is_free(port: int) -> bool:
    try:
        dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=5))
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize("engine", ["dead", "forgetful"])
def test_disconnect_destroys_our_group_when_an_engine_is_gone(engine, forgetful_engine, caplog):
    url = f"http://127.0.0.1:{_closed_port()}" if engine == "dead" else forgetful_engine
    sender = UpdateWeightFromDistributed([url], buckets=lambda: iter(()), timeout=5.0, backend="gloo",
                                         master_address="127.0.0.1")
    port = free_port()
    group = sender.group = init_weight_update_group("127.0.0.1", port, 0, 1, sender.group_name, "gloo")
    assert not _port_is_free(port)  # rank 0 serves the group's store there
    sender.disconnect()
    assert sender.group is None and group.pg is None and group.store is None
    assert _port_is_free(port)
    assert any("unreachable while dropping slime-weights-pp0" in r.getMessage() for r in caplog.records)
