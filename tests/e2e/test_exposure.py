"""End to end, what a running job shows other users of its node: `train.py` (trainer, one local
engine, sglang-router, a weight sync over a gloo group) runs with a known key while a watcher polls
every process's command line and the listening sockets of the job's processes (those whose
environment carries the key: Ray's own included). The key is on no command line, ever; the
engine, the router, its metrics, both rendezvous stores and Ray's own servers (GCS, raylet, the
core worker of the driver and of every actor, the agents) listen on loopback only; Ray's token
file is its owner's only. What the watcher saw is the table of docs/security.md."""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from slime.ray.access import ray_token_path
from slime.utils.security import API_KEY_ENV
from tests.e2e.runner import REPO_ROOT, grpo_argv, subprocess_env

pytestmark = pytest.mark.e2e

KEY = "e2e-exposure-key-7d41c0b9a2"
# The trainer's log lines naming the addresses of the rendezvous stores (rank 0 serves them).
STORE_LINES = (r"process group up: rank 0/\d+ backend \w+, rendezvous ([\d.]+):(\d+)",
               r"weight update group \S+: \d+ engine rank\(s\) at ([\d.]+):(\d+)")
# Processes of ours (not Ray's), by command line: every socket they listen on is the job's.
OUR_PROCESSES = ("sglang::router", "slime.backends.sglang_utils.router_main", "slime.backends.local_engine")


class Watcher:
    """Polls, until stopped, every process's command line (for KEY) and the listening TCP sockets
    of the job's processes: `root` and its descendants (Ray's own among them), and any process
    whose environment holds KEY."""

    def __init__(self, root: int):
        self.root = root
        self.key_seen: list[tuple[int, str]] = []
        self.listening: dict[tuple[str, int], str] = {}  # (address, port) -> the process's command line
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        needle = f"{API_KEY_ENV}={KEY}".encode()
        while not self.stop.is_set():
            try:
                family = {p.pid for p in psutil.Process(self.root).children(recursive=True)} | {self.root}
            except psutil.Error:  # the job ended
                family = set()
            for proc in psutil.process_iter():
                try:
                    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
                    if KEY.encode() in cmdline:
                        self.key_seen.append((proc.pid, cmdline.replace(b"\0", b" ").decode(errors="replace")))
                    if proc.pid == os.getpid():
                        continue
                    if proc.pid not in family and needle not in Path(f"/proc/{proc.pid}/environ").read_bytes():
                        continue
                    command = " ".join(proc.cmdline())[:200]
                    for conn in proc.net_connections(kind="tcp"):
                        if conn.status == psutil.CONN_LISTEN and command:  # empty: exiting meanwhile
                            self.listening.setdefault((conn.laddr.ip, conn.laddr.port), command)
                except (OSError, psutil.Error):  # gone meanwhile
                    continue


def test_job_exposes_no_key_and_its_servers_only_on_loopback(e2e_inputs, tmp_path):
    argv = grpo_argv(e2e_inputs.hf, e2e_inputs.torch_dist, e2e_inputs.data, tmp_path, 1)
    env = {**subprocess_env(), API_KEY_ENV: KEY}
    log_path = tmp_path / "train.log"
    with open(log_path, "w") as log:
        job = subprocess.Popen([sys.executable, "train.py", *argv], cwd=REPO_ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    watcher = Watcher(job.pid)
    watcher.thread.start()
    try:
        code = job.wait(timeout=600)
    finally:
        job.kill()  # only when the wait ran out
        watcher.stop.set()
        watcher.thread.join()
    log = log_path.read_text()
    assert code == 0, log[-6000:]
    assert not watcher.key_seen, watcher.key_seen[:3]
    assert KEY not in log
    stores = {(m.group(1), int(m.group(2))) for pattern in STORE_LINES for m in re.finditer(pattern, log)}
    assert len(stores) == 2, stores  # the training group's and the weight-update group's
    servers = {(ip, port) for (ip, port), cmd in watcher.listening.items() if any(p in cmd for p in OUR_PROCESSES)}
    assert len(servers) >= 3, watcher.listening  # engine, router, router metrics at least
    ours = stores | servers
    for host, port in ours:
        bound = {ip for ip, p in watcher.listening if p == port}
        assert host == "127.0.0.1" and bound == {"127.0.0.1"}, (host, port, bound)
    print("job listeners:", *sorted(watcher.listening.items()), sep="\n  ")
    # Ray's servers were seen: GCS, raylet, the driver's core worker, actors' (`ray::<actor or IDLE>`)
    for ray_server in ("/gcs_server ", "/raylet ", " train.py ", "ray::"):
        assert any(ray_server in cmd for cmd in watcher.listening.values()), (ray_server, watcher.listening)
    # nothing of the job, Ray's servers included, listens on an address other hosts can reach
    exposed = {(ip, port): cmd for (ip, port), cmd in watcher.listening.items() if not is_loopback_address(ip)}
    assert not exposed, exposed
    assert stat.S_IMODE(ray_token_path().stat().st_mode) & 0o077 == 0


def is_loopback_address(ip: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4 loopback address mapped into IPv6 (`::ffff:127.0.0.1`, how
    Ray's gRPC servers show on a dual-stack socket)."""
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback
