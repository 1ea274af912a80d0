"""Where the job's servers listen and whom they accept, decided once per job from Ray's view.

Owns `bind_host` (loopback when the Ray cluster is one node: nothing outside it needs to reach the
engines or the router), `job_weight_dirs` (the folders `/update_weights_from_disk` may load from)
and `trainer_hosts` (the addresses a weight-update rendezvous may point at). The key itself is
`slime.utils.security`'s; see docs/security.md for the whole picture.
"""

from __future__ import annotations

import ray

LOOPBACK = "127.0.0.1"
# Flags naming the job's own folders (weights in, checkpoints out, metrics and logs).
WEIGHT_DIR_FLAGS = ("hf_checkpoint", "load", "save", "save_hf", "ref_load", "metrics_dir")


def single_node() -> bool:
    """Whether the Ray cluster has exactly one live node."""
    return len([n for n in ray.nodes() if n.get("Alive")]) == 1


def bind_host() -> str:
    """The address the job's servers on this node bind: LOOPBACK on a one-node cluster, else the
    node's IP (other nodes' trainers and the router must reach it)."""
    return LOOPBACK if single_node() else ray.util.get_node_ip_address()


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
