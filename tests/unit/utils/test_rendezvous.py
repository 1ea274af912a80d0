"""Rendezvous stores listen on the group's master address only (loopback for a one-node job), not
on every interface as torch's TCPStore does by default; gloo's sockets of a loopback group too.
Checked from the kernel's view of the listening sockets (psutil), and by connecting from the
machine's non-loopback address when it has one."""

import datetime
import os
import socket
import threading

import psutil
import pytest

from slime.utils.misc import free_port
from slime.utils.rendezvous import gloo_device_env, is_loopback, store_for_group
from slime.utils.weight_transport import init_weight_update_group

TIMEOUT = datetime.timedelta(seconds=60)


def listening_addresses(pid: int = os.getpid()) -> dict[int, set[str]]:
    """port -> the addresses `pid` listens on (TCP)."""
    out: dict[int, set[str]] = {}
    for conn in psutil.Process(pid).net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN:
            out.setdefault(conn.laddr.port, set()).add(conn.laddr.ip)
    return out


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (None when it has none)."""
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not is_loopback(addr.address):
                return addr.address
    return None


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def test_store_serves_on_the_master_address_only():
    port = free_port()
    store = store_for_group("127.0.0.1", port, 2, True, TIMEOUT)
    client = store_for_group("127.0.0.1", port, 2, False, TIMEOUT)
    client.set("k", "v")
    assert store.get("k") == b"v"
    assert listening_addresses()[port] == {"127.0.0.1"}  # torch's default: every interface ('::' / '0.0.0.0')
    other = non_loopback_address()
    if other is not None:
        assert not reachable(other, port), f"the store answers on {other}:{port}"


def test_loopback_weight_group_listens_on_loopback_only():
    """Both ranks of a gloo weight-update group on 127.0.0.1 (as trainer and local engine form it on
    one node): every socket this process listens on for it is a loopback one."""
    before = set(listening_addresses())
    port, box = free_port(), {}

    def join(rank):
        box[rank] = init_weight_update_group("127.0.0.1", port, rank, 2, "g-rdv", "gloo", timeout_s=60)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert set(box) == {0, 1}
        opened = {p: a for p, a in listening_addresses().items() if p not in before}
        assert port in opened
        assert all(is_loopback(ip) for addrs in opened.values() for ip in addrs), opened
    finally:
        for group in box.values():
            group.destroy()


def test_gloo_interface_follows_a_loopback_master():
    assert gloo_device_env("127.0.0.1", {}) == {"GLOO_SOCKET_IFNAME": "lo"}
    assert gloo_device_env("localhost", {}) == {"GLOO_SOCKET_IFNAME": "lo"}
    assert gloo_device_env("127.0.0.1", {"GLOO_SOCKET_IFNAME": "eth1"}) == {}  # the user's choice stands
    other = non_loopback_address()
    if other is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    assert gloo_device_env(other, {}) == {}


def test_torchrun_agent_store_is_joined_not_served_again():
    """Under torchrun the agent already serves the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE):
    rank 0 binding it again failed every `torch.distributed.run` converter launch with 'Address
    already in use'."""
    from slime.utils.rendezvous import agent_serves_store

    assert agent_serves_store({"TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert not agent_serves_store({}) and not agent_serves_store({"TORCHELASTIC_USE_AGENT_STORE": "False"})
