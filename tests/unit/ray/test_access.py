"""What the job's engines accept: the folders of its flags, its trainer's addresses (loopback on one node)."""

import os
import socket
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest

from slime.ray import access


def test_weight_dirs_are_the_jobs_folder_flags():
    args = SimpleNamespace(hf_checkpoint="/m/hf", load=None, save="/r/ckpt", save_hf="/r/hf_final", ref_load="/r/ref",
                           metrics_dir="/r", prompt_data="/data/train.jsonl")
    assert access.job_weight_dirs(args) == ("/m/hf", "/r/ckpt", "/r/hf_final", "/r/ref", "/r")


def test_trainer_hosts(monkeypatch):
    placement = SimpleNamespace(locations=[("10.0.0.2", "n2", 0), ("10.0.0.2", "n2", 1), ("10.0.0.3", "n3", 0)])
    monkeypatch.setattr(access, "single_node", lambda: False)
    assert access.trainer_hosts(placement, (0, 1)) == ("10.0.0.2",)  # not the engine-only node
    assert access.trainer_hosts(placement, ()) == (access.LOOPBACK,)  # --debug-rollout-only: nobody else
    monkeypatch.setattr(access, "single_node", lambda: True)
    assert access.trainer_hosts(placement, (0,)) == ("10.0.0.2", access.LOOPBACK)


def test_the_router_binds_loopback_on_any_cluster(monkeypatch):
    """Every client of the job's router runs in the RolloutManager's process (the router's parent),
    so it never listens where other hosts reach the routes sglang-router serves without the key."""
    monkeypatch.setattr(access, "single_node", lambda: False)
    monkeypatch.setattr(access.ray.util, "get_node_ip_address", lambda: "10.0.0.2")
    assert access.bind_host() == "10.0.0.2"  # the engines: other nodes' trainers reach them
    assert access.ROUTER_HOST == access.LOOPBACK


def test_a_local_ray_keeps_loopback_as_its_node_address():
    """Ray 2.60 swaps 127.0.0.1 for the node's IP (and its gRPC servers then listen on every
    interface) unless its single-machine switch is on, which Ray reads when imported: as in
    train.py, `ray` is imported before `prepare_local_ray` runs. tests/e2e/test_exposure.py sees
    the sockets of a whole job."""
    probe = ("import os, ray; from ray._private import services; from slime.ray import access; "
             "before = services.get_node_ip_address(); access.prepare_local_ray(); "
             "print(before, services.get_node_ip_address(), services.resolve_ip_for_localhost('127.0.0.1'), "
             "os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'])")
    env = {k: v for k, v in os.environ.items() if k not in access.LOCAL_RAY_ENV}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    before, *after = out.stdout.split()
    assert before != access.LOOPBACK, out.stderr[-2000:]  # Ray's default: the node's IP
    assert after == [access.LOOPBACK, access.LOOPBACK, "0"], out.stderr[-2000:]


def test_ray_token_file_is_readable_by_its_owner_only(monkeypatch, tmp_path):
    """Ray 2.60 writes ~/.ray/auth_token 0644: whoever reads it joins the cluster (and reads the
    job's key from a worker's environment)."""
    token = tmp_path / "ray" / "auth_token"
    monkeypatch.setenv(access.RAY_TOKEN_PATH_ENV, str(token))
    assert access.private_ray_token(create=False) == token and not token.exists()  # a cluster's: never made up
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert access.private_ray_token(create=True) == token and not token.exists()  # Ray would read none
    monkeypatch.delenv("RAY_AUTH_MODE")
    access.private_ray_token(create=True)
    first = token.read_text()
    assert len(first) == 64 and int(first, 16) >= 0  # Ray's own format (secrets.token_hex(32))
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    token.chmod(0o644)  # as Ray leaves it
    access.private_ray_token(create=False)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.read_text() == first  # kept, made private


@pytest.fixture
def listener():
    """listen(host) -> the port of a TCP server bound to `host` (closed at the end)."""
    servers = []

    def listen(host: str) -> int:
        server = socket.create_server((host, 0))
        servers.append(server)
        return server.getsockname()[1]

    yield listen
    for server in servers:
        server.close()


def test_a_loopback_only_head_is_joined_in_single_machine_mode(monkeypatch, listener):
    """`RAY_ADDRESS=127.0.0.1:PORT` to a head in Ray's single-machine mode (listening on loopback
    only): without the switch, Ray 2.60 would swap 127.0.0.1 for the node's IP and retry there for
    ever. A head listening on every interface, a remote address, or a process already in that
    mode keep Ray's default."""
    from ray._private import services

    node_ip = services.get_node_ip_address()
    if node_ip in access.LOOPBACK_NAMES:
        pytest.skip("this machine has no address but loopback")
    monkeypatch.setattr(access.ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.delenv(access.SINGLE_MACHINE_ENV, raising=False)
    everywhere = listener("0.0.0.0")
    assert not access.prepare_ray_join(f"127.0.0.1:{everywhere}")  # a multi-node head
    assert not access.prepare_ray_join(f"{node_ip}:{everywhere}")
    assert access.ray_constants.ENABLE_RAY_CLUSTER and access.SINGLE_MACHINE_ENV not in os.environ
    loopback_only = listener(access.LOOPBACK)
    assert access.prepare_ray_join(f"localhost:{loopback_only}")
    assert not access.ray_constants.ENABLE_RAY_CLUSTER and os.environ[access.SINGLE_MACHINE_ENV] == "0"
    assert not access.prepare_ray_join(f"127.0.0.1:{loopback_only}")  # already in that mode
