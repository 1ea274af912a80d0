"""Critic domain (`--advantage-estimator ppo`): the value model's ranks, learning rate and checkpoints.

With ppo the job starts a second trainer group, the critic: the actor's architecture and parallel
sizes (TP/PP/CP/EP) with the output layer replaced by a one-output value head, on
`--critic-num-nodes` x `--critic-num-gpus-per-node` ranks of its own. `critic_view(args)` is the
namespace the critic's ranks (and the `--dry-run` plan) read: the actor's flags with the critic's
nodes, GPUs, learning rate, warm-up and checkpoint folders in their place.
"""

from __future__ import annotations

import argparse

from slime.utils.arguments.common import ArgumentError, check_load, positive_int, require

CRITIC_FLAGS = ("critic_num_nodes", "critic_num_gpus_per_node", "critic_load", "critic_save", "critic_lr",
                "critic_lr_warmup_iters")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the critic flags as one argument group."""
    group = parser.add_argument_group("critic", "Value model of --advantage-estimator ppo.")
    group.add_argument("--critic-num-nodes", type=positive_int("--critic-num-nodes"), default=None,
                       help="Nodes of the critic (None: --actor-num-nodes).")
    group.add_argument("--critic-num-gpus-per-node", type=positive_int("--critic-num-gpus-per-node"), default=None,
                       help="GPUs (CPU ranks without GPUs) per node of the critic (None: --actor-num-gpus-per-node).")
    group.add_argument("--critic-load", type=str, default=None,
                       help="Resume the critic from this torch_dist checkpoint folder. Equal to --critic-save "
                       "and holding no checkpoint yet (a first launch): the critic starts from --ref-load (the "
                       "actor's weights, new value head), with a warning; any other folder without a complete "
                       "checkpoint is an error.")
    group.add_argument("--critic-save", type=str, default=None,
                       help="Save the critic here at the actor's --save-interval (None: not saved).")
    group.add_argument("--critic-lr", type=float, default=None, help="Critic peak learning rate (None: --lr).")
    group.add_argument("--critic-lr-warmup-iters", type=int, default=0,
                       help="Critic learning-rate warm-up in optimizer steps.")


def uses_critic(args: argparse.Namespace) -> bool:
    """Whether the job trains a critic: `--advantage-estimator ppo` with a trainer."""
    return getattr(args, "advantage_estimator", None) == "ppo" and not getattr(args, "debug_rollout_only", False)


def critic_world_size(args: argparse.Namespace) -> int:
    """Critic ranks: --critic-num-nodes x --critic-num-gpus-per-node (0 without a critic)."""
    return args.critic_num_nodes * args.critic_num_gpus_per_node if uses_critic(args) else 0


def critic_view(args: argparse.Namespace) -> argparse.Namespace:
    """The flags as the critic's ranks see them: its nodes, GPUs, lr, warm-up and checkpoint
    folders in the actor's places; its own output layer (untied); no HF export, no reference
    model, no train-step hook or custom loss, no distillation teacher (those are the actor's)."""
    view = argparse.Namespace(**vars(args))
    view.actor_num_nodes, view.actor_num_gpus_per_node = args.critic_num_nodes, args.critic_num_gpus_per_node
    view.lr, view.lr_warmup_iters, view.lr_warmup_fraction = args.critic_lr, args.critic_lr_warmup_iters, None
    view.load, view.save, view.save_hf = args.critic_load, args.critic_save, None
    view.untie_embeddings_and_output_weights = True
    view.use_kl_loss = False
    view.loss_type = "policy_loss"
    view.custom_loss_function_path = None
    view.custom_megatron_before_train_step_hook_path = None
    view.rollout_data_postprocess_path = None
    view.custom_advantage_function_path = None
    view.use_opd, view.opd_type = False, None
    return view


def _check_layout(args: argparse.Namespace) -> None:
    world = critic_world_size(args)
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    ep = args.expert_model_parallel_size or 1
    etp = args.expert_tensor_parallel_size or tp
    flags = f"--critic-num-nodes x --critic-num-gpus-per-node = {world}"
    require(world % (tp * pp * cp) == 0, f"{flags} is not divisible by TP*PP*CP = {tp * pp * cp} (the critic "
            "shares the actor's --tensor/--pipeline/--context-model-parallel-size)")
    require(world % (pp * ep * etp) == 0, f"{flags} is not divisible by PP*EP*ETP = {pp * ep * etp} (the critic "
            "shares the actor's --expert-model-parallel-size)")
    dp = world // (tp * pp * cp)
    require(args.global_batch_size is None or args.global_batch_size % dp == 0,
            f"--global-batch-size {args.global_batch_size} is not divisible by the critic's data-parallel size "
            f"{dp} ({flags})")


def validate(args: argparse.Namespace) -> list[str]:
    """ppo: critic nodes/GPUs default to the actor's, --critic-lr to --lr; the critic's world
    must fit the shared parallel sizes and --global-batch-size; --colocate is refused;
    --value-clip > 0. Without ppo the critic flags and --num-critic-only-steps are ignored (warned)."""
    warnings: list[str] = []
    require(args.num_critic_only_steps >= 0, f"--num-critic-only-steps must be >= 0, got {args.num_critic_only_steps}")
    require(args.critic_lr_warmup_iters >= 0,
            f"--critic-lr-warmup-iters must be >= 0, got {args.critic_lr_warmup_iters}")
    if not uses_critic(args):
        given = [f"--{f.replace('_', '-')}" for f in CRITIC_FLAGS if getattr(args, f) not in (None, 0)]
        if args.num_critic_only_steps:
            given.append("--num-critic-only-steps")
        if given:
            warnings.append(f"{', '.join(given)} ignored: no critic without --advantage-estimator ppo "
                            "(or with --debug-rollout-only)")
        return warnings
    if args.colocate:
        raise ArgumentError("--advantage-estimator ppo does not support --colocate yet (the critic has no "
                            "memory hand-over with the engines): give the critic and the engines their own GPUs")
    require(args.value_clip > 0, f"--value-clip must be > 0 with --advantage-estimator ppo, got {args.value_clip}")
    args.critic_num_nodes = args.critic_num_nodes or args.actor_num_nodes
    args.critic_num_gpus_per_node = args.critic_num_gpus_per_node or args.actor_num_gpus_per_node
    if args.critic_lr is None:
        args.critic_lr = args.lr
    require(args.critic_lr is not None, "--advantage-estimator ppo needs --critic-lr (or --lr)")
    _check_layout(args)
    check_load(args, "--critic-load", args.critic_load, args.critic_save,
               "the critic starts from --ref-load (new value head)", warnings)
    if args.save and not args.critic_save:
        warnings.append("--save without --critic-save: the critic is not checkpointed (a resumed run starts "
                        "a fresh value head)")
    return warnings
