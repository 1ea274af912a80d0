"""Where the job's servers listen and whom they accept, decided once per job from Ray's view.

Owns `bind_host` (loopback when the Ray cluster is one node: nothing outside it needs to reach the
engines), `ROUTER_HOST` (the job's router: loopback on any cluster), `job_weight_dirs` (the folders `/update_weights_from_disk` may load from)
`trainer_hosts` (the addresses a weight-update rendezvous may point at), and Ray's own exposure:
`private_ray_token` (Ray's cluster token file readable by its owner only),
`prepare_local_ray` (a job-local Ray on loopback, without metrics exporter) and `prepare_ray_join`
(a loopback-only head joined on loopback). The key itself is `slime.utils.security`'s; see
docs/security.md for the whole picture.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import stat
from pathlib import Path

import ray
from ray._private import ray_constants

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# The address the job's own router binds, on any cluster: every client of it (the RolloutManager's
# registrations, the rollout and eval functions) runs in the RolloutManager's process, whose child
# the router is, and the router only connects out to the engines. sglang-router 0.3.2 serves a few
# routes without the key whatever its flags (docs/security.md); on loopback only users of that node
# reach them, as on a one-node job. A client on another node needs a router of its own
# (`router_main` on the node's address, named with --sglang-router-ip/--sglang-router-port).
ROUTER_HOST = LOOPBACK
# A job-local Ray (one node by construction):
# - without its Prometheus exporter (the dashboard agent serves it on every interface,
#   unauthenticated; the job reads no Ray metrics); Ray's dashboard is off too (`include_dashboard`);
# - on loopback: Ray 2.60 takes the node's IP for `127.0.0.1` (`_node_ip_address` included) and its
#   gRPC servers then listen on every interface, unless Ray's single-machine mode is on (the
#   default on macOS and Windows, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`): the node's address is
#   then 127.0.0.1, which Ray's servers (GCS, raylet, every worker's core worker, the agents) bind
#   alone, and no other node can join.
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOCAL_RAY_ENV = {"RAY_enable_metrics_collection": "0", SINGLE_MACHINE_ENV: "0"}
LOOPBACK_NAMES = (LOOPBACK, "localhost")
PROBE_TIMEOUT_S = 1.0
RAY_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
# Flags naming the job's own folders (weights in, checkpoints out, metrics and logs).
WEIGHT_DIR_FLAGS = ("hf_checkpoint", "load", "save", "save_hf", "ref_load", "metrics_dir")


def single_node() -> bool:
    """Whether the Ray cluster has exactly one live node."""
    return len([n for n in ray.nodes() if n.get("Alive")]) == 1


def bind_host() -> str:
    """The address the job's servers on this node bind: LOOPBACK on a one-node cluster, else the
    node's IP (other nodes' trainers and the router must reach it)."""
    return LOOPBACK if single_node() else ray.util.get_node_ip_address()


def prepare_local_ray() -> None:
    """Settings for a job-local Ray, before `ray.init` starts it: `LOCAL_RAY_ENV` into this
    process's environment (Ray's processes and the job's workers inherit it) and Ray's
    single-machine switch into this process's Ray, which read its environment variable when `ray`
    was imported (`ray_constants.ENABLE_RAY_CLUSTER`, consulted by `ray.init` for the node's
    address), before any flag of the job was known."""
    os.environ.update(LOCAL_RAY_ENV)
    _single_machine_mode()


def _single_machine_mode() -> None:
    """Ray's single-machine switch on, for Ray's processes started from here (the variable) and for
    this process's Ray, which read the variable when imported (`ray_constants.ENABLE_RAY_CLUSTER`)."""
    os.environ[SINGLE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _answers(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def prepare_ray_join(address: str) -> bool:
    """Before `ray.init(address)`: a head that listens on loopback only (Ray's single-machine mode,
    as the launch scripts start one on one node) is joined in that mode too. Without it, a process
    whose environment lacks the switch swaps 127.0.0.1 for the node's IP and retries the GCS there
    for ever, with warnings and no error. Returns whether the mode was switched on: only for a
    loopback `host:port` whose port answers on loopback and not on the node's IP (a multi-node
    head, which listens on every interface, keeps Ray's default)."""
    host, _, port = address.rpartition(":")
    if not ray_constants.ENABLE_RAY_CLUSTER or host not in LOOPBACK_NAMES or not port.isdigit():
        return False
    from ray._private.services import get_node_ip_address

    node_ip = get_node_ip_address()
    if node_ip in LOOPBACK_NAMES or _answers(node_ip, int(port)) or not _answers(LOOPBACK, int(port)):
        return False
    logger.info("the Ray head at %s listens on loopback only: joining it in Ray's single-machine mode "
                "(%s=0)", address, SINGLE_MACHINE_ENV)
    _single_machine_mode()
    return True


def job_weight_dirs(args) -> tuple[str, ...]:
    """The job's folders (`WEIGHT_DIR_FLAGS` that are set): disk weight updates load only from these."""
    return tuple(str(getattr(args, name)) for name in WEIGHT_DIR_FLAGS if getattr(args, name, None))


def trainer_hosts(placement, actor_bundles) -> tuple[str, ...]:
    """Addresses a trainer of the job can offer as rendezvous master: its bundles' node IPs, and
    LOOPBACK on a one-node cluster (the engines bind it there, so the trainer reaches them through
    it). Never empty: without trainer bundles (--debug-rollout-only) only LOOPBACK."""
    hosts = {placement.locations[p][0] for p in actor_bundles}
    if single_node() or not hosts:
        hosts.add(LOOPBACK)
    return tuple(sorted(hosts))


def ray_token_path() -> Path:
    """Where Ray reads its cluster token: `$RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`."""
    return Path(os.environ.get(RAY_TOKEN_PATH_ENV) or Path.home() / ".ray" / "auth_token")


def private_ray_token(create: bool) -> Path:
    """Make Ray's token file readable by its owner only (Ray 2.60 writes it 0644, and whoever reads
    it can join the cluster and read the job's key from a worker's environment): take group and
    other permissions off a file of ours; when absent and `create` (a job-local Ray, which would
    generate one unless `RAY_AUTH_MODE=disabled`), create it 0600 with a fresh token as Ray would (`secrets.token_hex(32)`).
    Returns its path."""
    path = ray_token_path()
    if not path.exists() and (not create or os.environ.get("RAY_AUTH_MODE") == "disabled"):
        return path  # a cluster's token is never made up; without token auth Ray reads none
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        info = path.stat()
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
            path.chmod(stat.S_IMODE(info.st_mode) & 0o700)
        return path
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    return path
