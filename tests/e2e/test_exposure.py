"""End to end, what a running job shows other users of its node: `train.py` (trainer, one local
engine, sglang-router, a weight sync over a gloo group) runs with a known key while a watcher polls
every process's command line and the listening sockets of the job's processes (those whose
environment carries the key: Ray's own included). The key is on no command line, ever; the
engine, the router, its metrics and both rendezvous stores listen on loopback only; Ray's token
file is its owner's only. What the watcher saw is the table of docs/security.md."""

from __future__ import annotations

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
# Ray's processes: its binaries, its Python components, its workers (`ray::<actor>`), and the
# driver (train.py), whose Ray core worker serves gRPC.
RAY_PROCESS = re.compile(r"^ray::|/site-packages/ray/|^\S*python\S* train\.py ")
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
    # every listener of the job on a non-loopback address is Ray's (gRPC servers, its agents)
    exposed = {(ip, port): cmd for (ip, port), cmd in watcher.listening.items() if ip not in ("127.0.0.1", "::1")}
    assert not {port for _, port in exposed} & {port for _, port in ours}, exposed
    print("job listeners:", *sorted(watcher.listening.items()), sep="\n  ")
    assert not {k: cmd for k, cmd in exposed.items() if not RAY_PROCESS.search(cmd)}
    assert stat.S_IMODE(ray_token_path().stat().st_mode) & 0o077 == 0
