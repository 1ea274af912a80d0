"""Data domain: prompt data and its keys, chat templating, how many rollouts run, and how one
rollout's samples are cut into training steps and micro-batches."""

from __future__ import annotations

import argparse
import json

from slime.utils.arguments.common import (
    ArgumentError,
    check_path_exists,
    data_parallel_size,
    positive_int,
    require,
    strip_slice,
)


def json_dict(text: str) -> dict:
    """Argparse ``type`` for ``--apply-chat-template-kwargs``: a JSON object string -> dict."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"--apply-chat-template-kwargs is not valid JSON ({error}): {text!r}")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--apply-chat-template-kwargs must be a JSON object, got {text!r}")
    return value


json_dict.__name__ = "JSON object"


def _add_prompts(group) -> None:
    group.add_argument("--prompt-data", type=str, default=None,
                       help="Prompt file (.jsonl or .parquet), optionally sliced with a @[start:end] suffix.")
    group.add_argument("--input-key", type=str, default="input", help="Row key holding the prompt.")
    group.add_argument("--label-key", type=str, default=None, help="Row key holding the label.")
    group.add_argument("--metadata-key", type=str, default="metadata", help="Row key holding sample metadata.")
    group.add_argument("--tool-key", type=str, default="tools", help="Row key holding tool definitions.")
    group.add_argument("--apply-chat-template", action="store_true", default=False,
                       help="Render prompts with the tokenizer's chat template (generation prompt added).")
    group.add_argument("--apply-chat-template-kwargs", type=json_dict, default="{}",
                       help="JSON object of extra keyword arguments for apply_chat_template.")


def _add_schedule(group) -> None:
    group.add_argument("--num-rollout", type=positive_int("--num-rollout"), default=None,
                       help="Number of rollouts (training iterations of the RL loop).")
    group.add_argument("--num-epoch", type=positive_int("--num-epoch"), default=None,
                       help="Epochs over the prompt data; used when --num-rollout is not given.")
    group.add_argument("--rollout-batch-size", type=positive_int("--rollout-batch-size"), default=None,
                       help="Prompts per rollout (required).")
    group.add_argument("--n-samples-per-prompt", type=positive_int("--n-samples-per-prompt"), default=1,
                       help="Responses sampled per prompt (one group).")
    group.add_argument("--global-batch-size", type=positive_int("--global-batch-size"), default=None,
                       help="Samples per optimizer step. None: rollout-batch-size x n-samples-per-prompt / "
                       "num-steps-per-rollout.")
    group.add_argument("--num-steps-per-rollout", type=positive_int("--num-steps-per-rollout"), default=None,
                       help="Optimizer steps per rollout; derives --global-batch-size (default 1 step).")
    group.add_argument("--micro-batch-size", type=positive_int("--micro-batch-size"), default=1,
                       help="Samples per micro-batch per data-parallel rank (without dynamic batch size).")
    group.add_argument("--balance-data", action="store_true", default=False,
                       help="Balance token counts across data-parallel ranks.")
    group.add_argument("--use-dynamic-batch-size", action="store_true", default=False,
                       help="Pack micro-batches up to --max-tokens-per-gpu tokens instead of a fixed size.")
    group.add_argument("--max-tokens-per-gpu", type=positive_int("--max-tokens-per-gpu"), default=None,
                       help="Token budget of one micro-batch per GPU with --use-dynamic-batch-size.")
    group.add_argument("--log-probs-max-tokens-per-gpu", type=positive_int("--log-probs-max-tokens-per-gpu"),
                       default=None, help="Token budget for log-prob passes (None: = --max-tokens-per-gpu).")
    group.add_argument("--start-rollout-id", type=int, default=None,
                       help="First rollout id (None: from the loaded checkpoint, else 0).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the data flags as one argument group."""
    group = parser.add_argument_group("data", "Prompt data, rollout count and batching.")
    _add_prompts(group)
    _add_schedule(group)


def _resolve_global_batch(args: argparse.Namespace) -> None:
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    what = (f"--rollout-batch-size {args.rollout_batch_size} x --n-samples-per-prompt "
            f"{args.n_samples_per_prompt} = {samples}")
    if args.num_steps_per_rollout is not None:
        steps = args.num_steps_per_rollout
        require(samples % steps == 0, f"{what} is not divisible by --num-steps-per-rollout {steps}")
        derived = samples // steps
        if args.global_batch_size is not None and args.global_batch_size != derived:
            raise ArgumentError(f"--global-batch-size {args.global_batch_size} disagrees with --num-steps-per-rollout "
                                f"{steps} ({what} / {steps} = {derived}); give one of them")
        args.global_batch_size = derived
    elif args.global_batch_size is None:
        args.global_batch_size = samples
    require(samples % args.global_batch_size == 0,
            f"{what} is not divisible by --global-batch-size {args.global_batch_size}")
    args.num_steps_per_rollout = samples // args.global_batch_size


def _validate_batching(args: argparse.Namespace) -> None:
    dp = data_parallel_size(args)
    if args.use_dynamic_batch_size:
        require(args.max_tokens_per_gpu is not None, "--use-dynamic-batch-size requires --max-tokens-per-gpu")
    else:
        step = args.micro_batch_size * dp
        require(args.global_batch_size % step == 0,
                f"--global-batch-size {args.global_batch_size} is not divisible by --micro-batch-size "
                f"{args.micro_batch_size} x data-parallel size {dp} (without --use-dynamic-batch-size)")
    if args.log_probs_max_tokens_per_gpu is None:
        args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu


def validate(args: argparse.Namespace) -> list[str]:
    """--rollout-batch-size is required, and --num-rollout or --num-epoch. --global-batch-size
    defaults to rollout-batch-size x n-samples-per-prompt / --num-steps-per-rollout (1 step), must
    divide that product and agree with --num-steps-per-rollout when both are given. Without
    --use-dynamic-batch-size it must be divisible by --micro-batch-size x DP; with it,
    --max-tokens-per-gpu is required (and is the default of --log-probs-max-tokens-per-gpu).
    --prompt-data (without its @[a:b] slice) must exist. Runs after the megatron domain (DP)."""
    warnings: list[str] = []
    require(args.rollout_batch_size is not None, "--rollout-batch-size is required")
    if args.num_rollout is None and args.num_epoch is None:
        raise ArgumentError("give --num-rollout or --num-epoch (how long to train)")
    if args.num_rollout is not None and args.num_epoch is not None:
        warnings.append(f"--num-rollout {args.num_rollout} and --num-epoch {args.num_epoch} both given: "
                        "--num-rollout wins")
    _resolve_global_batch(args)
    _validate_batching(args)
    if args.prompt_data is not None:
        check_path_exists(args, "--prompt-data", strip_slice(args.prompt_data), warnings)
    elif not args.debug_train_only:
        warnings.append("--prompt-data not given: the data source must supply prompts itself")
    return warnings
