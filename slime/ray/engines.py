"""Rollout engine actors and the engine-kind registry.

One Ray actor (`RolloutEngine`) per engine, pinned to the first rollout bundle of that engine
(`JobPlacement.strategy(position)`). The actor owns the engine server process on its node: it
picks a free port, starts the server (our local engine, or real SGLang through
`slime.backends.sglang_utils.engine.launch`), reports its URL and health, stops it, restarts it
(fault tolerance) and asks it to release / resume memory (`--offload-rollout`).

`ENGINE_KINDS` maps "local" / "sglang" to how a server of that kind is launched; `resolve_engine_kind`
turns `args.rollout_engine` ("auto" by default) into one of them: sglang when CUDA is available
and `sglang` is importable, else local.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import ray

from slime.backends.local_engine.launcher import launch_local_engine, stop_local_engine
from slime.ray.placement import JobPlacement, PlacementPlan
from slime.utils.engine_client import SyncEngineClient
from slime.utils.misc import free_port

logger = logging.getLogger(__name__)

# How long an engine may take to become healthy, and a health probe to answer.
ENGINE_START_TIMEOUT_S = 600.0
HEALTH_PROBE_TIMEOUT_S = 5.0


def _launch_local(args, *, engine_rank: int, host: str, port: int, num_threads: int,
                  log_path: str | None) -> subprocess.Popen:
    """Our SGLang-compatible server on `args.hf_checkpoint` (CPU, or CUDA when the bundle has a GPU)."""
    on_gpu = bool(ray.get_gpu_ids())
    extra = ["--num-threads", num_threads, "--random-seed", int(getattr(args, "seed", 0) or 0) + engine_rank]
    return launch_local_engine(
        args.hf_checkpoint, port, host=host, dtype="bfloat16" if on_gpu else "float32",
        device="cuda" if on_gpu else "cpu", extra_args=extra, timeout=ENGINE_START_TIMEOUT_S,
        log_path=log_path,
    )


def _launch_sglang(args, *, engine_rank: int, host: str, port: int, num_threads: int,
                   log_path: str | None) -> subprocess.Popen:
    """A real SGLang server through the sglang backend's launcher (GPU nodes)."""
    from slime.backends.sglang_utils.engine import launch

    return launch(args, engine_rank=engine_rank, host=host, port=port)


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
    """Ray actor owning one engine server process (create through `create_engines`)."""

    def __init__(self, args, engine_rank: int, kind: str, num_threads: int = 1, log_dir: str | None = None):
        """Remember how to launch; nothing starts until `start()`."""
        self.args, self.engine_rank, self.kind = args, engine_rank, ENGINE_KINDS[kind]
        self.num_threads = num_threads
        self.log_dir = log_dir
        self.host = ray.util.get_node_ip_address()
        self.process: subprocess.Popen | None = None
        self._url: str | None = None

    def start(self, avoid_port: int | None = None) -> str:
        """Start the server on a free port of this node (never `avoid_port`: a restarted engine
        gets a new URL, so the weight sender sees it changed and rebuilds its group); returns
        its base URL once healthy."""
        port = free_port(self.host)
        while port == avoid_port:
            port = free_port(self.host)
        log_path = None
        if self.log_dir:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
            log_path = str(Path(self.log_dir) / f"engine_{self.engine_rank}.log")
        self.process = self.kind.launch(self.args, engine_rank=self.engine_rank, host=self.host, port=port,
                                        num_threads=self.num_threads, log_path=log_path)
        self._url = f"http://{self.host}:{port}"
        logger.info("engine %d up at %s (pid %d)", self.engine_rank, self._url, self.process.pid)
        return self._url

    def url(self) -> str | None:
        """Base URL of the running server (None before `start`)."""
        return self._url

    def pid(self) -> int | None:
        """Process id of the server (tests kill it to exercise fault tolerance)."""
        return self.process.pid if self.process is not None else None

    def is_healthy(self) -> bool:
        """True if the server process lives and GET /health answers 200."""
        if self.process is None or self.process.poll() is not None:
            return False
        import requests

        try:
            return requests.get(f"{self._url}/health", timeout=HEALTH_PROBE_TIMEOUT_S).status_code == 200
        except requests.RequestException as exc:  # an unreachable engine is unhealthy, not an error
            logger.warning("engine %d at %s: health probe failed: %s", self.engine_rank, self._url, exc)
            return False

    def stop(self) -> None:
        """Stop the server process group (no-op when it is not running)."""
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
        cuda_graph; None: all) (`POST /release_memory_occupation`)."""
        SyncEngineClient(self._url).release_memory_occupation(tags)

    def resume_memory(self, tags: list[str] | None = None) -> None:
        """Ask the server to take the memory of `tags` back (`POST /resume_memory_occupation`)."""
        SyncEngineClient(self._url).resume_memory_occupation(tags)


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


def create_engine_actor(args, placement: JobPlacement, position: int, engine_rank: int, kind: str):
    """One `RolloutEngine` actor on sorted bundle `position` (not started)."""
    # The bundle's device is the engine's; the actor itself asks for no CPU so that, colocated, it
    # fits beside a trainer rank holding the whole CPU of a CPU-only bundle.
    options = {"num_cpus": 0, "scheduling_strategy": placement.strategy(position)}
    if placement.use_gpu:
        options["num_gpus"] = 0.2
    actor_cls = ray.remote(RolloutEngine)
    log_dir = args.rollout_log_dir
    return actor_cls.options(**options).remote(args, engine_rank, kind, args.rollout_num_gpus_per_engine, log_dir)


def create_engines(args, placement: JobPlacement, rollout_bundles=None) -> tuple[str, list, list[int]]:
    """Create (not start) one engine actor per engine; returns (kind, actors, positions)."""
    kind = resolve_engine_kind(args.rollout_engine, placement.use_gpu)
    positions = engine_positions(args, placement, rollout_bundles)
    actors = [create_engine_actor(args, placement, p, rank, kind) for rank, p in enumerate(positions)]
    logger.info("%d %s engine(s) on bundle positions %s", len(actors), kind, positions)
    return kind, actors, positions

