"""UpdateWeightFromDistributed.disconnect when an engine is gone (fault tolerance restarted it
elsewhere): the dead engine is skipped, the group is dropped, and a fresh connect is possible."""

import socket

from slime.backends.megatron_utils.update_weight.from_distributed import UpdateWeightFromDistributed


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


def test_disconnect_skips_an_unreachable_engine(caplog):
    url = f"http://127.0.0.1:{_closed_port()}"
    sender = UpdateWeightFromDistributed([url], buckets=lambda: iter(()), timeout=5.0, backend="gloo",
                                         master_address="127.0.0.1")
    sender.group = "connected"  # as after connect(): the engine then died
    sender.disconnect()
    assert sender.group is None
    assert any("unreachable while dropping slime-weights-pp0" in r.getMessage() for r in caplog.records)
