"""The trainer as a group of Ray actors, one per rank, on the actor bundles of the placement group.

`RayTrainGroup` starts the actors, gives them the torch.distributed rendezvous (rank 0's node IP
and a free port), and fans every call out to all ranks: megatron needs every rank to take part in
every collective. Results are those of rank 0 (the trainer makes metrics identical on all ranks).
"""

from __future__ import annotations

import logging
import os

import ray

from slime.ray.placement import JobPlacement

logger = logging.getLogger(__name__)


@ray.remote
class TrainActor:
    """One trainer rank: a `MegatronTrainer` behind Ray method calls."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.trainer = None

    def node_address(self) -> tuple[str, int]:
        """This actor's node IP and a free port on it (rank 0's become the rendezvous)."""
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init(self, args, master_addr: str, master_port: int) -> int:
        """Start torch.distributed and megatron, build the trainer, load weights; returns the
        rollout id to start from."""
        import logging as _logging

        _logging.basicConfig(level=_logging.INFO, format=f"[rank {self.rank}] %(levelname)s %(name)s: %(message)s")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from slime.backends.megatron_utils.actor import MegatronTrainer
        from slime.backends.megatron_utils.parallel import initialize_megatron

        initialize_megatron(args, rank=self.rank, world_size=self.world_size,
                            master_addr=master_addr, master_port=master_port)
        self.trainer = MegatronTrainer(args)
        return self.trainer.load_initial_state()

    def call(self, method: str, *args, **kwargs):
        """Run `MegatronTrainer.<method>` on this rank."""
        return getattr(self.trainer, method)(*args, **kwargs)


class RayTrainGroup:
    """All trainer ranks; methods run on every rank and return rank 0's result."""

    def __init__(self, args, placement: JobPlacement, bundles: tuple[int, ...]):
        self.args = args
        world = len(bundles)
        num_gpus = 0.4 if (placement.use_gpu and args.colocate) else (1 if placement.use_gpu else 0)
        self.actors = [
            TrainActor.options(
                num_cpus=0 if placement.use_gpu else 1,
                num_gpus=num_gpus,
                scheduling_strategy=placement.strategy(position),
                runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
            ).remote(rank, world)
            for rank, position in enumerate(bundles)
        ]

    def init(self) -> int:
        """Rendezvous at rank 0's node and build every rank's trainer; returns the start rollout id."""
        master_addr, master_port = ray.get(self.actors[0].node_address.remote())
        starts = ray.get([a.init.remote(self.args, master_addr, master_port) for a in self.actors])
        return starts[0]

    def run(self, method: str, *args, **kwargs):
        """`MegatronTrainer.<method>(*args)` on every rank (objects are put once and shared)."""
        refs = [ray.put(a) if not isinstance(a, ray.ObjectRef) else a for a in args]
        return ray.get([actor.call.remote(method, *refs, **kwargs) for actor in self.actors])[0]

    def train(self, rollout_id: int, rollout_data: dict) -> dict:
        return self.run("train", rollout_id, rollout_data)

    def save(self, rollout_id: int) -> None:
        self.run("save", rollout_id)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
