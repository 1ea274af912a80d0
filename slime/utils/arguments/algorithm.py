"""Algorithm domain: advantage estimator, policy loss and clipping, KL and entropy terms,
truncated importance sampling, reference model cadence, routing replay and the loss plugins."""

from __future__ import annotations

import argparse

from slime.utils.arguments.common import positive_int, require

ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")


def _add_policy(group) -> None:
    group.add_argument("--advantage-estimator", type=str, choices=ADVANTAGE_ESTIMATORS, default="grpo",
                       help="How advantages are computed from rewards.")
    group.add_argument("--loss-type", type=str, choices=LOSS_TYPES, default="policy_loss",
                       help="Training loss; custom_loss needs --custom-loss-function-path.")
    group.add_argument("--eps-clip", type=float, default=0.2, help="PPO clip range (lower side).")
    group.add_argument("--eps-clip-high", type=float, default=None, help="PPO clip upper side (None: = --eps-clip).")
    group.add_argument("--eps-clip-c", type=float, default=None, help="Dual-clip constant c (> 1); None disables.")
    group.add_argument("--value-clip", type=float, default=0.2, help="Clip range of the value loss (ppo).")
    group.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty folded into the reward.")
    group.add_argument("--use-kl-loss", action="store_true", default=False,
                       help="Add a KL(actor || reference) term to the loss.")
    group.add_argument("--kl-loss-coef", type=float, default=0.0, help="Weight of the KL loss term.")
    group.add_argument("--kl-loss-type", type=str, choices=KL_LOSS_TYPES, default="k1",
                       help="KL estimator: k1 log ratio, k2 squared/2, k3 = low_var_kl.")
    group.add_argument("--entropy-coef", type=float, default=0.0, help="Weight of the entropy bonus.")
    group.add_argument("--gamma", type=float, default=1.0, help="Discount factor (ppo / reinforce++).")
    group.add_argument("--lambd", type=float, default=1.0, help="GAE lambda (ppo).")
    group.add_argument("--normalize-advantages", action="store_true", default=False,
                       help="Whiten advantages across the data-parallel batch.")
    group.add_argument("--disable-grpo-std-normalization", action="store_true", default=False,
                       help="GRPO: subtract the group mean without dividing by the group std.")
    group.add_argument("--disable-rewards-normalization", action="store_true", default=False,
                       help="Use raw rewards (no group normalisation).")


def _add_correction(group) -> None:
    group.add_argument("--use-tis", action="store_true", default=False,
                       help="Truncated importance sampling between rollout and training log-probs.")
    group.add_argument("--tis-clip", type=float, default=2.0, help="Upper clip of the TIS weight.")
    group.add_argument("--tis-clip-low", type=float, default=0.0, help="Lower clip of the TIS weight.")
    group.add_argument("--use-rollout-logprobs", action="store_true", default=False,
                       help="Use the engines' log-probs as the old policy instead of recomputing them.")
    group.add_argument("--ref-update-interval", type=positive_int("--ref-update-interval"), default=None,
                       help="Copy the actor's weights into the reference model after every this many rollouts "
                       "(None: never).")
    group.add_argument("--num-critic-only-steps", type=int, default=0,
                       help="Rollouts at the start that train only the critic (ppo).")
    group.add_argument("--use-routing-replay", action="store_true", default=False,
                       help="Replay the MoE routing of the old log-prob pass in the training passes.")
    group.add_argument("--use-rollout-routing-replay", action="store_true", default=False,
                       help="R3: replay the engines' MoE routing (rollout_routed_experts) in every actor forward; "
                       "implies --use-routing-replay and --sglang-enable-return-routed-experts.")
    group.add_argument("--custom-loss-function-path", type=str, default=None,
                       help="fn(args, batch, logits, sum_of_sample_mean) -> (loss, log_dict); --loss-type custom_loss.")
    group.add_argument("--custom-advantage-function-path", type=str, default=None,
                       help="fn(args, rollout_data) setting advantages and returns.")
    group.add_argument("--custom-tis-function-path", type=str, default=None,
                       help="fn(args=, pg_loss=, train_log_probs=, rollout_log_probs=, loss_masks=, "
                       "total_lengths=, response_lengths=) -> (pg_loss, masks, metrics); used with --use-tis.")
    group.add_argument("--custom-pg-loss-reducer-function-path", type=str, default=None,
                       help="factory(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) -> "
                       "reducer; reduces the policy-gradient loss in place of the sum of sample means.")


LOSS_MASK_TYPES = ("qwen", "qwen3", "distill_qwen")


def _add_sft(group) -> None:
    """slime's SFT path: --loss-type sft_loss on samples whose loss mask marks the assistant tokens."""
    group.add_argument("--disable-compute-advantages-and-returns", action="store_true", default=False,
                       help="Skip the advantage / return computation (and the old-policy log-prob pass, which "
                       "only the policy loss reads): SFT with --loss-type sft_loss, or a --loss-type "
                       "custom_loss that needs neither.")
    group.add_argument("--loss-mask-type", type=str, choices=LOSS_MASK_TYPES, default="qwen",
                       help="Chat template family of slime.rollout.sft_rollout.generate_rollout, which trains on "
                       "the assistant turns only. Every choice takes the mask from the tokenizer's own chat "
                       "template (rendered turn by turn), so any template whose rendering of a conversation "
                       "extends that of its prefix works; one that rewrites earlier turns is refused naming it.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the algorithm flags as one argument group."""
    group = parser.add_argument_group("algorithm", "RL objective: advantages, losses, KL, TIS.")
    _add_policy(group)
    _add_correction(group)
    _add_sft(group)


def validate(args: argparse.Namespace) -> list[str]:
    """--eps-clip-high defaults to --eps-clip; --eps-clip-c > 1; --loss-type custom_loss needs
    --custom-loss-function-path; --tis-clip-low <= --tis-clip; --disable-compute-advantages-and-returns
    only with --loss-type sft_loss / custom_loss, no --custom-advantage-function-path, no ppo."""
    warnings: list[str] = []
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    require(args.eps_clip >= 0 and args.eps_clip_high >= 0,
            f"--eps-clip {args.eps_clip} and --eps-clip-high {args.eps_clip_high} must be >= 0")
    require(args.eps_clip_c is None or args.eps_clip_c > 1.0, f"--eps-clip-c must be > 1, got {args.eps_clip_c}")
    if args.loss_type == "custom_loss":
        require(args.custom_loss_function_path is not None,
                "--loss-type custom_loss requires --custom-loss-function-path")
    elif args.custom_loss_function_path is not None:
        warnings.append(f"--custom-loss-function-path is ignored with --loss-type {args.loss_type}")
    if args.custom_tis_function_path and not args.use_tis:
        warnings.append("--custom-tis-function-path is ignored without --use-tis (as in slime)")
    require(args.tis_clip_low <= args.tis_clip,
            f"--tis-clip-low {args.tis_clip_low} must be <= --tis-clip {args.tis_clip}")
    if args.ref_update_interval is not None and not (args.use_kl_loss or args.kl_coef != 0):
        warnings.append("--ref-update-interval without --use-kl-loss / --kl-coef: there is no reference model")
    if args.disable_compute_advantages_and_returns:
        require(args.loss_type != "policy_loss" and args.custom_advantage_function_path is None,
                "--disable-compute-advantages-and-returns leaves no advantages: use it with --loss-type sft_loss "
                f"or custom_loss, not --loss-type {args.loss_type}"
                + (" / --custom-advantage-function-path" if args.custom_advantage_function_path else ""))
        require(args.advantage_estimator != "ppo",
                "--disable-compute-advantages-and-returns leaves the critic without returns: not with "
                "--advantage-estimator ppo")
    if (args.use_kl_loss or args.kl_coef != 0) and args.ref_load is None:
        warnings.append("--use-kl-loss / --kl-coef without --ref-load: the reference model starts from --load")
    _validate_routing_replay(args)
    return warnings


# ---- MoE routing replay (R3) ---------------------------------------------------------------------
def _validate_routing_replay(args: argparse.Namespace) -> None:
    """--use-rollout-routing-replay implies --use-routing-replay (as in slime) and asks the SGLang
    engines for their routed experts (--sglang-enable-return-routed-experts); both need an MoE model;
    --use-routing-replay alone records the routing in the old log-prob pass, which
    --use-rollout-logprobs skips."""
    if not (args.use_routing_replay or args.use_rollout_routing_replay):
        return
    flag = "--use-rollout-routing-replay" if args.use_rollout_routing_replay else "--use-routing-replay"
    require(bool(getattr(args, "num_experts", None)), f"{flag} needs a mixture-of-experts model (--num-experts)")
    if args.use_rollout_routing_replay:
        args.use_routing_replay = True
        args.sglang_enable_return_routed_experts = True
    else:
        require(not args.use_rollout_logprobs,
                "--use-routing-replay records the routing in the old log-prob pass, which --use-rollout-logprobs "
                "skips; use --use-rollout-routing-replay to replay the engines' routing instead")
