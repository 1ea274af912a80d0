"""Rollout engine actors and the engine-kind registry.

One Ray actor (`RolloutEngine`) per engine, pinned to the first rollout bundle of that engine
(`JobPlacement.strategy(position)`). The actor owns the engine server process on its node: it
binds loopback on a one-node cluster (`slime.ray.access`), picks a free port, starts the server (our local engine, or real SGLang through
`slime.backends.sglang_utils.engine.launch`), reports its URL and health, stops it, restarts it
(fault tolerance) and asks it to release / resume memory (`--offload-rollout`).

An SGLang engine uses all the GPUs of its bundles, as slime's engines do: its actor reserves a
share of its first bundle's GPU only, with Ray's NOSET visible-devices variables set
(`NOSET_VISIBLE_DEVICES_ENV`) so that it sees every GPU of its node, and SGLang gets
`--base-gpu-id` = the index of the engine's first GPU among them (`base_gpu_id`, from the
placement's bundle -> GPU mapping). An engine spanning several nodes (`engine_nodes`) starts one
SGLang process per node: its actor (node rank 0) creates a follower `RolloutEngine` on the first
bundle of each other node, picks `--dist-init-addr` (its host and a block of free ports) and starts them
with `--nnodes` / `--node-rank`; only node rank 0 serves HTTP.

`ENGINE_KINDS` maps "local" / "sglang" to how a server of that kind is launched; `resolve_engine_kind`
turns `args.rollout_engine` ("auto" by default) into one of them: sglang when CUDA is available
and `sglang` is importable, else local.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import ray

from slime.backends.local_engine.launcher import launch_local_engine, stop_local_engine
from slime.ray.access import bind_host, job_weight_dirs, trainer_hosts
from slime.ray.placement import JobPlacement, PlacementPlan
from slime.utils import engine_protocol
from slime.utils.engine_client import SyncEngineClient, run_with_client
from slime.utils.misc import free_port, free_port_block
from slime.utils.startup_profile import mark

logger = logging.getLogger(__name__)

# How long a health probe may take to answer (the start timeout is --engine-start-timeout).
HEALTH_PROBE_TIMEOUT_S = 5.0
# Ray leaves these devices' visibility alone in an actor that sets them (slime's list).
NOSET_VISIBLE_DEVICES_ENV = ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
                             "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
                             "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES")


@dataclass(frozen=True)
class EngineNode:
    """The part of one engine on one node: node rank among the engine's `nnodes`, the sorted
    bundle position of its first GPU there, and the Ray GPU ids of its bundles on that node."""

    node_rank: int
    nnodes: int
    position: int
    device_ids: tuple[int, ...]


def engine_nodes(placement: JobPlacement, position: int, num_gpus: int) -> list[EngineNode]:
    """Split the `num_gpus` bundles from sorted `position` on by node (bundles are sorted by node,
    then device). Raises ValueError when the nodes hold different numbers of the engine's GPUs
    (SGLang puts tp * pp / nnodes on each)."""
    groups: dict[tuple, list[int]] = {}
    for p in range(position, position + num_gpus):
        groups.setdefault(tuple(placement.locations[p][:2]), []).append(p)
    sizes = {len(ps) for ps in groups.values()}
    if len(sizes) > 1:
        raise ValueError(f"the engine on bundles {position}..{position + num_gpus - 1} spans nodes unevenly "
                         f"({[len(ps) for ps in groups.values()]} GPUs): make --rollout-num-gpus-per-engine a "
                         "multiple of --num-gpus-per-node, or at most it")
    return [EngineNode(rank, len(groups), ps[0], tuple(placement.locations[p][2] for p in ps))
            for rank, ps in enumerate(groups.values())]


def base_gpu_id(device_ids: tuple[int, ...], cuda_visible_devices: str | None) -> int:
    """SGLang's --base-gpu-id for GPUs `device_ids` (Ray GPU ids) of a process that sees every GPU
    of its node: the first id itself, or its index in `cuda_visible_devices` when the node lists
    its devices. SGLang uses base, base+1, ...: the ids must be consecutive there (ValueError)."""
    visible = [int(d) for d in cuda_visible_devices.split(",") if d.strip()] if cuda_visible_devices else None
    if visible is not None:
        missing = [d for d in device_ids if d not in visible]
        if missing:
            raise ValueError(f"GPUs {missing} of the engine are not in CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}")
    index = [visible.index(d) for d in device_ids] if visible is not None else list(device_ids)
    if index != list(range(index[0], index[0] + len(index))):
        raise ValueError(f"the engine's GPUs {list(device_ids)} are not consecutive on their node "
                         f"(CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}); SGLang takes base_gpu_id, base+1, ...")
    return index[0]


def _launch_local(args, *, engine_rank: int, host: str, port: int, num_threads: int,
                  log_path: str | None, group_hosts: tuple[str, ...] | None = None, **_sglang_only) -> subprocess.Popen:
    """Our SGLang-compatible server on `args.hf_checkpoint` (CPU, or CUDA when the bundle has a
    GPU), with the job's key (inherited `$SLIME_API_KEY`), disk updates only from the job's
    folders and rendezvous only towards `group_hosts` (the trainer's addresses).
    `--sglang-max-running-requests` caps its batch as it caps SGLang's (1: one request per
    forward, which makes rollout log-probs independent of which requests arrive together)."""
    on_gpu = bool(ray.get_gpu_ids())
    extra = ["--num-threads", num_threads, "--random-seed", int(getattr(args, "seed", 0) or 0) + engine_rank]
    if getattr(args, "sglang_max_running_requests", None):
        extra += ["--max-running-requests", args.sglang_max_running_requests]
    return launch_local_engine(
        args.hf_checkpoint, port, host=host, dtype="bfloat16" if on_gpu else "float32",
        device="cuda" if on_gpu else "cpu", extra_args=extra, timeout=args.engine_start_timeout,
        log_path=log_path, weight_dirs=job_weight_dirs(args), group_hosts=group_hosts,
    )


def _launch_sglang(args, *, engine_rank: int, host: str, port: int, num_threads: int, log_path: str | None,
                   node: EngineNode | None = None, dist_init_addr: str | None = None,
                   **_local_only) -> subprocess.Popen:
    """A real SGLang server through the sglang backend's launcher (GPU nodes): this node's part
    of the engine, on its GPUs counted among those this process sees (NOSET: all the node's).
    It gets the job's --api-key; SGLang has no folder or rendezvous allow-list (the key guards)."""
    from slime.backends.sglang_utils.engine import launch

    base = base_gpu_id(node.device_ids, os.environ.get("CUDA_VISIBLE_DEVICES")) if node is not None else 0
    return launch(args, engine_rank=engine_rank, host=host, port=port, base_gpu_id=base, log_path=log_path,
                  node_rank=node.node_rank if node is not None else 0, dist_init_addr=dist_init_addr)


def _sglang_available(use_gpu: bool) -> bool:
    # Decided from the placement, not torch.cuda: Ray hides the GPUs from actors (like the
    # RolloutManager) that reserved none.
    return use_gpu and importlib.util.find_spec("sglang") is not None


@dataclass(frozen=True)
class EngineKind:
    """How one kind of engine server is started and stopped, and whether it can run on bundles
    with (`available(True)`) or without (`available(False)`) GPUs."""

    launch: Callable[..., subprocess.Popen]
    stop: Callable[[subprocess.Popen], int | None]
    available: Callable[[bool], bool]


# Both launchers start the server in its own process group, so the same stop ends either.
ENGINE_KINDS: dict[str, EngineKind] = {
    "local": EngineKind(launch=_launch_local, stop=stop_local_engine, available=lambda use_gpu: True),
    "sglang": EngineKind(launch=_launch_sglang, stop=stop_local_engine, available=_sglang_available),
}


def resolve_engine_kind(requested: str | None, use_gpu: bool) -> str:
    """"auto" (or None) -> "sglang" when the bundles have GPUs and the sglang package is
    importable, else "local".

    An explicit kind must be a key of ENGINE_KINDS and available (raises ValueError naming
    `--rollout-engine` otherwise).
    """
    if requested in (None, "auto"):
        return "sglang" if ENGINE_KINDS["sglang"].available(use_gpu) else "local"
    if requested not in ENGINE_KINDS:
        raise ValueError(f"--rollout-engine {requested!r}: choose one of auto, {', '.join(ENGINE_KINDS)}")
    if not ENGINE_KINDS[requested].available(use_gpu):
        raise ValueError(f"--rollout-engine {requested}: not available on this node "
                         "(sglang needs GPU bundles and `pip install sglang`)")
    return requested


class RolloutEngine:
    """Ray actor owning one engine server process (create through `start_engines`).

    `nodes` (SGLang engines) lists the engine's part on each node; this actor runs `nodes[0]`'s
    and, for node rank 0 of a multi-node engine, creates a follower actor for each other node on
    `placement` (followers share the actor's fate: Ray ends them with it).
    """

    def __init__(self, args, engine_rank: int, kind: str, num_threads: int = 1, log_dir: str | None = None,
                 nodes: list[EngineNode] | None = None, placement: JobPlacement | None = None):
        """Remember how to launch; nothing starts until `start()`."""
        self.args, self.engine_rank, self.kind = args, engine_rank, ENGINE_KINDS[kind]
        self.num_threads = num_threads
        self.log_dir = log_dir
        self.node = nodes[0] if nodes else None
        self.host = bind_host()
        self.group_hosts = (trainer_hosts(placement, PlacementPlan.from_args(args).actor_bundles)
                            if placement is not None else None)
        self.process: subprocess.Popen | None = None
        self._url: str | None = None
        self.followers = []
        if nodes and nodes[0].node_rank == 0:
            self.followers = [_engine_actor(placement, node.position, kind).remote(
                args, engine_rank, kind, num_threads, log_dir, [node]) for node in nodes[1:]]

    def _log_path(self) -> str | None:
        if not self.log_dir:
            return None
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        suffix = f"_node{self.node.node_rank}" if self.node is not None and self.node.node_rank else ""
        return str(Path(self.log_dir) / f"engine_{self.engine_rank}{suffix}.log")

    def start(self, avoid_port: int | None = None, dist_init_addr: str | None = None) -> str:
        """Start the server on a free port of this node (never `avoid_port`: a restarted engine
        gets a new URL, so the weight sender sees it changed and rebuilds its group); returns
        its base URL once healthy. Node rank 0 of a multi-node engine first picks
        `dist_init_addr` (its host and the first of `dist_init_port_count` consecutive free ports,
        not the HTTP one) and starts its followers with it."""
        port = free_port(self.host)
        while port == avoid_port:
            port = free_port(self.host)
        if self.followers:  # SGLang derives its ZMQ ports from this one: a whole free block
            from slime.backends.sglang_utils.server_args import dist_init_port_count

            base = free_port_block(self.host, dist_init_port_count(self.args), exclude=(port,))
            dist_init_addr = f"{self.host}:{base}"
            ray.get([f.start.remote(dist_init_addr=dist_init_addr) for f in self.followers])
        extra = {"node": self.node, "dist_init_addr": dist_init_addr} if self.node is not None else {}
        extra["group_hosts"] = self.group_hosts
        mark(f"engine {self.engine_rank}: launching its server")
        self.process = self.kind.launch(self.args, engine_rank=self.engine_rank, host=self.host, port=port,
                                        num_threads=self.num_threads, log_path=self._log_path(), **extra)
        self._url = f"http://{self.host}:{port}"
        logger.info("engine %d up at %s (pid %d)", self.engine_rank, self._url, self.process.pid)
        return self._url

    def process_alive(self) -> bool:
        """True while this actor's server process runs."""
        return self.process is not None and self.process.poll() is None

    def url(self) -> str | None:
        """Base URL of the running server (None before `start`)."""
        return self._url

    def pid(self) -> int | None:
        """Process id of the server (tests kill it to exercise fault tolerance)."""
        return self.process.pid if self.process is not None else None

    def is_healthy(self) -> bool:
        """True if the server process lives and GET /health answers 200."""
        if not self.process_alive() or not all(ray.get([f.process_alive.remote() for f in self.followers])):
            return False
        import requests

        try:
            return requests.get(f"{self._url}/health", timeout=HEALTH_PROBE_TIMEOUT_S).status_code == 200
        except requests.RequestException as exc:  # an unreachable engine is unhealthy, not an error
            logger.warning("engine %d at %s: health probe failed: %s", self.engine_rank, self._url, exc)
            return False

    def stop(self) -> None:
        """Stop the server process group and the followers' (no-op when it is not running)."""
        ray.get([f.stop.remote() for f in self.followers])
        if self.process is not None:
            code = self.kind.stop(self.process)
            logger.info("engine %d at %s stopped (exit code %s)", self.engine_rank, self._url, code)
            self.process = None

    def restart(self) -> str:
        """Stop whatever is left of the server and start a fresh one at a new URL; returns it."""
        old_port = int(self._url.rsplit(":", 1)[1]) if self._url else None
        self.stop()
        return self.start(avoid_port=old_port)

    def release_memory(self, tags: list[str] | None = None) -> None:
        """Ask the server to release the memory of SGLang's `tags` (weights, kv_cache,
        cuda_graph; None: all) once it is idle (`engine_protocol.release_memory`: /flush_cache
        retried until 200, then `POST /release_memory_occupation`)."""
        run_with_client(self._url, lambda c: engine_protocol.release_memory(c, tags))

    def resume_memory(self, tags: list[str] | None = None) -> None:
        """Ask the server to take the memory of `tags` back (`POST /resume_memory_occupation`;
        only tags it released)."""
        run_with_client(self._url, lambda c: engine_protocol.resume_memory(c, tags))


def engine_positions(args, placement: JobPlacement, rollout_bundles=None) -> list[int]:
    """Sorted bundle position of each engine's first device (`--rollout-num-gpus-per-engine` apart).

    `rollout_bundles` defaults to `PlacementPlan.from_args(args).rollout_bundles`.
    """
    bundles = tuple(PlacementPlan.from_args(args).rollout_bundles if rollout_bundles is None else rollout_bundles)
    per_engine = args.rollout_num_gpus_per_engine
    if not bundles or len(bundles) % per_engine:
        raise ValueError(f"--rollout-num-gpus {len(bundles)} must be a positive multiple of "
                         f"--rollout-num-gpus-per-engine {per_engine}")
    if max(bundles) >= len(placement.sorted_bundles):
        raise ValueError(f"the placement has {len(placement.sorted_bundles)} bundles but the rollout "
                         f"needs bundle {max(bundles)} (check --rollout-num-gpus and --colocate)")
    return list(bundles[::per_engine])


def engine_actor_options(placement: JobPlacement, position: int, kind: str) -> dict:
    """Ray options of an engine actor on sorted bundle `position`: no CPU (colocated, it fits
    beside a trainer rank holding a CPU-only bundle's whole CPU), a share of the bundle's GPU, and
    for SGLang the NOSET variables, so the actor sees its node's every GPU, not only that one."""
    options = {"num_cpus": 0, "scheduling_strategy": placement.strategy(position)}
    if placement.use_gpu:
        options["num_gpus"] = 0.2
        if kind == "sglang":
            options["runtime_env"] = {"env_vars": {name: "1" for name in NOSET_VISIBLE_DEVICES_ENV}}
    return options


def _engine_actor(placement: JobPlacement, position: int, kind: str):
    return ray.remote(RolloutEngine).options(**engine_actor_options(placement, position, kind))


def create_engine_actor(args, placement: JobPlacement, position: int, engine_rank: int, kind: str):
    """One `RolloutEngine` actor on sorted bundle `position` (not started); an SGLang engine's
    actor gets its nodes (`engine_nodes`) and creates its followers on the other nodes."""
    per_engine = args.rollout_num_gpus_per_engine
    nodes = engine_nodes(placement, position, per_engine) if kind == "sglang" else None
    return _engine_actor(placement, position, kind).remote(args, engine_rank, kind, per_engine,
                                                          args.rollout_log_dir, nodes, placement)


@dataclass
class EngineStart:
    """The job's engines, created and starting (`start_engines`); `urls` holds one ObjectRef per
    actor, its `start()`, which answers the engine's base URL once it is healthy."""

    kind: str
    actors: list
    positions: list[int]
    urls: list


def start_engines(args, placement: JobPlacement, rollout_bundles=None) -> EngineStart:
    """Create one engine actor per engine and start them all, without waiting. The job's driver
    calls it as soon as the placement is ready, so that the engines, the longest part of start-up,
    start while the RolloutManager's own process starts (docs/performance.md, "Start-up")."""
    kind = resolve_engine_kind(args.rollout_engine, placement.use_gpu)
    positions = engine_positions(args, placement, rollout_bundles)
    actors = [create_engine_actor(args, placement, p, rank, kind) for rank, p in enumerate(positions)]
    logger.info("%d %s engine(s) on bundle positions %s", len(actors), kind, positions)
    return EngineStart(kind, actors, positions, [actor.start.remote() for actor in actors])

