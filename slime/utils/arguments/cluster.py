"""Cluster domain: how many nodes and GPUs the trainer and the rollout engines get, colocation
and offloading, and the memory figures the ``--dry-run`` plan budgets against."""

from __future__ import annotations

import argparse

from slime.utils.arguments.common import ArgumentError, positive_int, require, world_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the cluster flags as one argument group."""
    group = parser.add_argument_group("cluster", "Placement of the trainer and the rollout engines.")
    group.add_argument("--actor-num-nodes", type=positive_int("--actor-num-nodes"), default=1,
                       help="Number of nodes for the training actor.")
    group.add_argument("--actor-num-gpus-per-node", type=positive_int("--actor-num-gpus-per-node"), default=8,
                       help="GPUs per node for the training actor.")
    group.add_argument("--rollout-num-gpus", type=positive_int("--rollout-num-gpus"), default=None,
                       help="Total GPUs for the rollout engines. None: equal to the actor's GPUs when "
                       "--colocate (required otherwise).")
    group.add_argument("--rollout-num-gpus-per-engine", type=positive_int("--rollout-num-gpus-per-engine"),
                       default=1, help="GPUs per SGLang engine; engine tp size = this / --sglang-pp-size.")
    group.add_argument("--num-gpus-per-node", type=positive_int("--num-gpus-per-node"), default=8,
                       help="GPUs per node of the cluster, used to place rollout engines.")
    group.add_argument("--colocate", action="store_true", default=False,
                       help="Share GPUs between the trainer and the engines (train.py only). "
                       "Turning this on also turns on --offload.")
    group.add_argument("--offload", action="store_true", default=False,
                       help="Shorthand for --offload-train --offload-rollout.")
    # slime's BooleanOptionalAction pair: None follows --offload (and --colocate); --no-X keeps it off.
    group.add_argument("--offload-train", action=argparse.BooleanOptionalAction, default=None,
                       help="Give the trainer's device memory (weights, optimizer state, gradient buffers) back "
                       "after each weight sync and take it back before training (see docs/architecture.md). "
                       "Default: on with --offload / --colocate; --no-offload-train keeps the trainer resident.")
    group.add_argument("--offload-rollout", action=argparse.BooleanOptionalAction, default=None,
                       help="Release the engines' weights, KV cache and CUDA graphs while the trainer trains "
                       "(SGLang engines start with their memory saver on). Default: on with --offload / "
                       "--colocate; --no-offload-rollout keeps the engines' memory.")
    group.add_argument("--gpu-memory-gib", type=float, default=80.0,
                       help="Memory of one GPU in GiB, used by the --dry-run memory plan.")
    group.add_argument("--host-memory-gib", type=float, default=None,
                       help="Host RAM per node in GiB for the --dry-run plan's verdict (None: not checked).")


def validate(args: argparse.Namespace) -> list[str]:
    """--colocate is refused by train_async and with more rollout GPUs than trainer GPUs;
    --colocate turns on --offload, which turns on --offload-train and --offload-rollout (the
    memory hand-over) unless given as --no-offload-train / --no-offload-rollout; --rollout-num-gpus defaults to the actor GPUs when
    colocated and is required otherwise (unless --debug-train-only), and must be divisible by
    --rollout-num-gpus-per-engine; memory sizes must be > 0."""
    warnings: list[str] = []
    if args.colocate and args.entry == "train_async":
        raise ArgumentError("--colocate cannot be used with train_async.py (one-step-off needs separate GPUs)")
    require(args.gpu_memory_gib > 0, f"--gpu-memory-gib must be > 0, got {args.gpu_memory_gib}")
    require(args.host_memory_gib is None or args.host_memory_gib > 0,
            f"--host-memory-gib must be > 0, got {args.host_memory_gib}")
    if args.colocate:
        args.offload = True
    for dest in ("offload_train", "offload_rollout"):  # an explicit --X / --no-X wins over --offload
        if getattr(args, dest) is None:
            setattr(args, dest, bool(args.offload))
    if args.rollout_num_gpus is None:
        if args.colocate:
            args.rollout_num_gpus = world_size(args)
        elif not args.debug_train_only:
            raise ArgumentError("--rollout-num-gpus is required unless --colocate or --debug-train-only")
    if args.rollout_num_gpus is not None:
        source = " (with --colocate: the trainer's GPUs)" if args.colocate else ""
        require(args.rollout_num_gpus % args.rollout_num_gpus_per_engine == 0,
                f"--rollout-num-gpus {args.rollout_num_gpus}{source} is not divisible by "
                f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine}")
    if args.colocate and args.rollout_num_gpus is not None and args.rollout_num_gpus > world_size(args):
        raise ArgumentError(
            f"--colocate with --rollout-num-gpus {args.rollout_num_gpus} > the trainer's GPUs "
            f"(--actor-num-nodes x --actor-num-gpus-per-node = {world_size(args)}): colocated weight sync "
            "hands every engine GPU its weights from the trainer rank on the same GPU (CUDA IPC), so "
            "engines may use only GPUs that hold a trainer rank")
    return warnings
