"""Rendezvous stores and gloo devices scoped to the address the group is reached at.

torch's `TCPStore` server listens on every interface (`*:port`) and has no authentication: any
client that reaches the port can list, read, write and delete the keys of a group while it forms
(`list_keys`, `set`, `delete_key`). torch offers no secret for it, so the one guard is where it
listens: `store_for_group` creates rank 0's store on a socket bound to the group's master address
only (`master_listen_fd`; the libuv backend accepts it), which is loopback when the job runs on
one node (nothing outside the node reaches it) and the node's address otherwise (not every
interface). Other ranks connect as usual. `gloo_device_env` does the same for gloo's own
listening sockets, which otherwise follow the address the host name resolves to.

Imports torch only (utils layer).
"""

from __future__ import annotations

import datetime
import ipaddress
import socket

import torch.distributed as dist

GLOO_IFNAME_ENV = "GLOO_SOCKET_IFNAME"
LISTEN_BACKLOG = 2048


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) resolves to a loopback address."""
    try:
        return ipaddress.ip_address(socket.getaddrinfo(host, None)[0][4][0]).is_loopback
    except (OSError, ValueError):
        return False


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host`'s address only (not every interface), at `port`."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def agent_serves_store(environ) -> bool:
    """Whether torchrun's agent already serves the rendezvous store on MASTER_PORT (torch's own
    `env://` rule: `TORCHELASTIC_USE_AGENT_STORE=True`): every rank, rank 0 included, is then a
    client of it (binding the port again fails with 'Address already in use'); the agent binds it,
    so how it listens is torchrun's choice (`--rdzv-endpoint` / `--master-addr`)."""
    return environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def store_for_group(master_address: str, master_port: int, world_size: int, is_server: bool,
                    timeout: datetime.timedelta) -> dist.TCPStore:
    """The group's TCPStore: on rank 0 (`is_server`) served on `master_address` only, elsewhere
    a client of it. The server does not wait for the clients here (the group's own
    set-up does)."""
    if not is_server:
        return dist.TCPStore(master_address, int(master_port), world_size, False, timeout=timeout)
    fd = listening_socket(master_address, int(master_port)).detach()
    return dist.TCPStore(master_address, int(master_port), world_size, True, timeout=timeout,
                         wait_for_workers=False, master_listen_fd=fd)


def gloo_device_env(master_address: str, environ) -> dict[str, str]:
    """`{GLOO_SOCKET_IFNAME: "lo"}` when the group's master is loopback (a one-node job) and no
    interface was chosen in `environ`, else {}: gloo then listens on loopback, not on the
    address the host name resolves to."""
    if environ.get(GLOO_IFNAME_ENV) or not is_loopback(master_address):
        return {}
    return {GLOO_IFNAME_ENV: "lo"}


def loopback_gloo_device():
    """A gloo device on 127.0.0.1 (for groups whose master is loopback)."""
    return dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")
