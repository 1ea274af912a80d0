"""The trainer as a group of Ray actors, one per rank, on the actor bundles of the placement group.

`RayTrainGroup` starts the actors, gives them the torch.distributed rendezvous (rank 0's node IP
and a free port), and fans every call out to all ranks: megatron needs every rank to take part in
every collective. Results are those of rank 0 (the trainer makes metrics identical on all ranks).

A call fails fast: the first rank that raises or dies ends the call with a `TrainerRankError`
naming the rank(s) and the cause, instead of the other ranks waiting in a collective for it.
"""

from __future__ import annotations

import logging
import os
import re

import ray

from slime.ray.access import bind_host
from slime.ray.placement import JobPlacement
from slime.utils.misc import free_port

logger = logging.getLogger(__name__)

# After the first failed rank, how long to wait for the others' results: a rank that died makes
# its peers fail in their next collective, and the dead one is the cause worth naming first.
FAILURE_GRACE_S = 3.0

# Environment of every trainer rank. SGLang sets NCCL_CUMEM_ENABLE=0 in its engines (unless
# --enable-symm-mem); the trainer's NCCL weight-sync group with them needs the same value.
TRAINER_ENV = {"OMP_NUM_THREADS": "1", "NCCL_CUMEM_ENABLE": "0"}
# --deterministic-mode: megatron-core's TE attention raises unless TE's non-deterministic
# (fused / flash backward) algorithms are off
DETERMINISTIC_ENV = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}


def trainer_env(args) -> dict[str, str]:
    """Environment of every trainer rank: TRAINER_ENV, plus DETERMINISTIC_ENV with --deterministic-mode."""
    return {**TRAINER_ENV, **(DETERMINISTIC_ENV if getattr(args, "deterministic_mode", False) else {})}

# What one rank of a group runs, by the group's role: "module:class", imported on the rank.
TRAINER_CLASSES = {
    "actor": "slime.backends.megatron_utils.actor:MegatronTrainer",
    "critic": "slime.backends.megatron_utils.critic:MegatronCritic",
}


class TrainerRankError(RuntimeError):
    """One or more trainer ranks raised or died during a group call."""

    def __init__(self, method: str, failures: list[tuple[int, BaseException]]):
        self.method, self.failures = method, failures
        parts = [f"rank {rank} {'died' if isinstance(e, ray.exceptions.RayActorError) else 'raised'}: "
                 f"{_cause(e)}" for rank, e in failures]
        super().__init__(f"trainer {method} failed on {'; '.join(parts)}")

    def __reduce__(self):  # rebuild from the constructor's arguments (Ray pickles exceptions)
        return type(self), (self.method, self.failures)


def _cause(error: BaseException) -> str:
    """The user's exception inside a RayTaskError (its last traceback line), else the error. An
    exception without a message (a bare `assert`) also names the frame that raised it."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        text = f"{type(cause).__name__}: {cause}".splitlines()[-1]
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', str(error))
        if not str(cause).strip() and frames:
            text += " (raised at {}:{} in {})".format(*frames[-1])
        return text[:500]
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:500]


def gather_ranks(refs: list, method: str) -> list:
    """ray.get over one ref per rank, failing fast: raises TrainerRankError naming every rank
    that failed within FAILURE_GRACE_S of the first failure (dead actors first)."""
    pending, results, failures = list(refs), {}, []
    index = {ref: rank for rank, ref in enumerate(refs)}
    while pending:
        timeout = FAILURE_GRACE_S if failures else None
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
        if not ready:
            break
        try:
            results[index[ready[0]]] = ray.get(ready[0])
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:  # a rank failed
            failures.append((index[ready[0]], e))
    if failures:
        failures.sort(key=lambda f: not isinstance(f[1], ray.exceptions.RayActorError))
        raise TrainerRankError(method, failures)
    return [results[rank] for rank in range(len(refs))]


@ray.remote
class TrainActor:
    """One trainer rank: a `MegatronTrainer` (or, role "critic", a `MegatronCritic`) behind Ray
    method calls."""

    def __init__(self, rank: int, world_size: int, role: str = "actor"):
        self.rank, self.world_size, self.role = rank, world_size, role
        self.trainer = None

    def node_address(self) -> tuple[str, int]:
        """The address the job's servers bind on this node (`slime.ray.access.bind_host`: loopback
        on a one-node cluster, else the node's IP) and a free port on it; rank 0's become the
        training group's rendezvous, whose store listens on that address only."""
        host = bind_host()
        return host, free_port(host)

    def init(self, args, master_addr: str, master_port: int) -> int:
        """Start torch.distributed and megatron, build the trainer, load weights; returns the
        rollout id to start from."""
        import logging as _logging
        import warnings

        tag = f"{self.role} rank" if self.role != "actor" else "rank"
        _logging.basicConfig(level=_logging.INFO, format=f"[{tag} {self.rank}] %(levelname)s %(name)s: %(message)s")
        # megatron-core 0.16 calls collectives torch 2.13 deprecates (reduce_scatter_tensor, ...):
        # the FutureWarning would repeat on every step of every rank
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from slime.backends.megatron_utils.lean_import import import_megatron_core

        import_megatron_core()  # first: megatron-core's own imports, at a third of their cost
        from slime.backends.megatron_utils.parallel import initialize_megatron
        from slime.utils.misc import load_function
        from slime.utils.startup_profile import mark

        mark(f"{tag} {self.rank}: imports done")
        initialize_megatron(args, rank=self.rank, world_size=self.world_size,
                            master_addr=master_addr, master_port=master_port)
        mark(f"{tag} {self.rank}: megatron initialized")
        self.trainer = load_function(TRAINER_CLASSES[self.role])(args)
        mark(f"{tag} {self.rank}: model and optimizer built")
        start = self.trainer.load_initial_state()
        mark(f"{tag} {self.rank}: checkpoint loaded")
        return start

    def call(self, method: str, *args, **kwargs):
        """Run `MegatronTrainer.<method>` on this rank."""
        return getattr(self.trainer, method)(*args, **kwargs)


class RayTrainGroup:
    """All trainer ranks of one role ("actor" or "critic", see TRAINER_CLASSES); methods run on
    every rank and return rank 0's result."""

    def __init__(self, args, placement: JobPlacement, bundles: tuple[int, ...], role: str = "actor"):
        if role not in TRAINER_CLASSES:
            raise ValueError(f"unknown trainer role {role!r}; choices: {sorted(TRAINER_CLASSES)}")
        self.args = args
        world = len(bundles)
        num_gpus = 0.4 if (placement.use_gpu and args.colocate) else (1 if placement.use_gpu else 0)
        self.actors = [
            TrainActor.options(
                num_cpus=0 if placement.use_gpu else 1,
                num_gpus=num_gpus,
                scheduling_strategy=placement.strategy(position),
                runtime_env={"env_vars": trainer_env(args)},
            ).remote(rank, world, role)
            for rank, position in enumerate(bundles)
        ]

    def init(self) -> int:
        """Rendezvous at rank 0's node and build every rank's trainer; returns the start rollout id."""
        master_addr, master_port = ray.get(self.actors[0].node_address.remote())
        starts = gather_ranks([a.init.remote(self.args, master_addr, master_port) for a in self.actors], "init")
        return starts[0]

    def run(self, method: str, *args, **kwargs):
        """`MegatronTrainer.<method>(*args)` on every rank (objects are put once and shared)."""
        refs = [ray.put(a) if not isinstance(a, ray.ObjectRef) else a for a in args]
        return gather_ranks([actor.call.remote(method, *refs, **kwargs) for actor in self.actors], method)[0]

    def train(self, rollout_id: int, rollout_data: dict) -> dict:
        return self.run("train", rollout_id, rollout_data)

    def save(self, rollout_id: int) -> None:
        self.run("save", rollout_id)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
