"""The colocated timeline of the ``--dry-run`` plan: memory of one GPU in each phase of the
hand-over between the trainer and the engines that share it (``docs/dry-run-plan.md``).

Phases, in the order the loop runs them (``slime.ray.job.ActorSide``):
1. **train**: the engines have released weights, KV cache and CUDA graphs; the trainer holds
   everything (its budget from ``memory.py``, which already counts the sleeping engine's residue);
2. **weight sync**: the trainer has given back its optimizer state and gradients and keeps its
   weights and the sync buckets; the engines have resumed their weights only;
3. **rollout**: the trainer has given back its weights too (its CUDA context and NCCL
   communicators stay); the engines hold their static pool (weights + KV cache) and, outside it,
   CUDA graphs and activations.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass

from slime.utils.plan.engine import EngineMemory
from slime.utils.plan.memory import COLOCATED_ENGINE_RESIDUE_GIB, FRAGMENTATION, GIB, RESERVE_GIB, TrainerMemory

# An SGLang engine's memory outside its static pool while it generates: CUDA graphs, activations
# of the largest captured batch, sampling buffers (SGLang sizes the pool so that this remains).
ENGINE_RUNTIME_GIB = 4.0


@dataclass
class Phase:
    """One phase of the colocated timeline: bytes per part on one GPU against the budget."""

    name: str
    parts: dict[str, int]
    budget: int

    @property
    def total(self) -> int:
        """Bytes on the GPU in this phase."""
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        """True when the phase's total is within --gpu-memory-gib."""
        return self.total <= self.budget


def _sync_buffers(args: Namespace, engine: EngineMemory) -> int:
    """The sender's buckets: one --update-weight-buffer-size bucket, and its fp8 copy with the
    per-block scales when the engine serves FP8."""
    bucket = int(args.update_weight_buffer_size)
    return bucket + (bucket // 2 if engine.weight_dtype == "fp8" else 0)


def colocated_timeline(args: Namespace, trainer: TrainerMemory, engine: EngineMemory | None) -> list[Phase] | None:
    """The three phases of one GPU shared by a trainer rank and an engine (None unless --colocate
    with engines)."""
    if not getattr(args, "colocate", False) or engine is None:
        return None
    budget = int(args.gpu_memory_gib * GIB)
    trainer_context = int(sum(RESERVE_GIB.values()) * GIB)
    residue = int(COLOCATED_ENGINE_RESIDUE_GIB * GIB)
    weights = trainer.parts["weights"]
    engine_running = {"engine static pool (weights + KV)": engine.reserved,
                      "engine CUDA graphs + activations": int(ENGINE_RUNTIME_GIB * GIB)}
    # --no-offload-train keeps the whole trainer resident; --no-offload-rollout keeps the engine's.
    offload_train, offload_rollout = getattr(args, "offload_train", True), getattr(args, "offload_rollout", True)
    resident_trainer = {f"trainer {name} (--no-offload-train)": b for name, b in trainer.parts.items()}
    train = dict(trainer.parts)
    if not offload_rollout:
        train |= {f"{name} (--no-offload-rollout)": b for name, b in engine_running.items()}
    if offload_train:
        sync = {"trainer weights": weights, "sync buckets": _sync_buffers(args, engine), "engine weights": engine.weights}
        sync["allocator fragmentation"] = int(FRAGMENTATION * sum(sync.values()))
        sync |= {"trainer context + NCCL": trainer_context, "engine residue": residue}
        rollout = {"trainer context + NCCL": trainer_context} | engine_running
    else:
        sync = resident_trainer | {"sync buckets": _sync_buffers(args, engine), "engine weights": engine.weights,
                                   "engine residue": residue}
        rollout = resident_trainer | engine_running
    return [Phase("train (engines released)" if offload_rollout else "train (engines resident)", train, budget),
            Phase("weight sync (trainer optimizer + grads offloaded)" if offload_train
                  else "weight sync (trainer resident)", sync, budget),
            Phase("rollout (trainer offloaded)" if offload_train else "rollout (trainer resident)", rollout, budget)]
