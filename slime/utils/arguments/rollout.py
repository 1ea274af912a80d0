"""Rollout domain: the HF checkpoint the engines serve, sampling parameters, the rollout plugins
(generate, filter, data source, buffer, sample hooks), rewards and weight-update transport."""

from __future__ import annotations

import argparse
import os

from slime.utils.arguments.common import DEFAULT_ROLLOUT_FUNCTION, ArgumentError, check_path_exists, positive_int, require

RM_BASE_TYPES = ("deepscaler", "dapo", "math", "f1", "gpqa", "remote_rm", "random", "char_match")
RM_TYPES = RM_BASE_TYPES + tuple(f"boxed_{name}" for name in RM_BASE_TYPES)


def _add_sampling(group) -> None:
    group.add_argument("--hf-checkpoint", type=str, default=None,
                       help="Hugging Face checkpoint directory: the engines' model, the tokenizer and "
                       "the config that MODEL_ARGS are checked against.")
    group.add_argument("--rollout-temperature", type=float, default=1.0, help="Sampling temperature (> 0).")
    group.add_argument("--rollout-top-p", type=float, default=1.0, help="Nucleus sampling top-p in (0, 1].")
    group.add_argument("--rollout-top-k", type=int, default=-1, help="Top-k sampling; -1 disables it.")
    group.add_argument("--rollout-max-response-len", type=int, default=None,
                       help="Maximum new tokens per response (SGLang max_new_tokens).")
    group.add_argument("--rollout-max-prompt-len", type=int, default=None,
                       help="Prompts longer than this many tokens are dropped when the data is loaded.")
    group.add_argument("--rollout-max-context-len", type=int, default=None,
                       help="Maximum prompt + response tokens: each request's max_new_tokens is cut so the total "
                       "fits (a prompt already at the limit gets no response and is marked truncated).")
    group.add_argument("--rollout-stop", type=str, nargs="+", default=None, help="Stop strings.")
    group.add_argument("--rollout-stop-token-ids", type=int, nargs="+", default=None, help="Stop token ids.")
    group.add_argument("--rollout-skip-special-tokens", action="store_true", default=False,
                       help="Drop special tokens from the decoded response text.")
    group.add_argument("--rollout-shuffle", action="store_true", default=False,
                       help="Shuffle prompts (seed --rollout-seed + epoch).")
    group.add_argument("--rollout-seed", type=int, default=42, help="Seed for prompt shuffling and sampling.")
    group.add_argument("--over-sampling-batch-size", type=int, default=None,
                       help="Prompts submitted per generation round with dynamic sampling "
                       "(None: = --rollout-batch-size; must be >= it).")
    group.add_argument("--partial-rollout", action="store_true", default=False,
                       help="Keep unfinished generations aborted at the end of a rollout and resume them later.")


def _add_plugins(group) -> None:
    group.add_argument("--rollout-function-path", type=str, default=DEFAULT_ROLLOUT_FUNCTION,
                       help="generate_rollout(args, rollout_id, data_source, evaluation=False).")
    group.add_argument("--custom-generate-function-path", type=str, default=None,
                       help="async generate(args, sample, sampling_params) replacing the default generation.")
    group.add_argument("--dynamic-sampling-filter-path", type=str, default=None,
                       help="filter(args, samples, **kwargs) -> DynamicFilterOutput deciding if a group is kept.")
    group.add_argument("--data-source-path", type=str, default="slime.rollout.data_source.RolloutDataSourceWithBuffer",
                       help="Class(args) with get_samples, add_samples, save, load, __len__.")
    group.add_argument("--buffer-filter-path", type=str, default=None,
                       help="fn(args, rollout_id, buffer, num_samples) picking groups out of the buffer.")
    group.add_argument("--rollout-sample-hook-path", type=str, action="append", default=[],
                       help="hook(args, sample[, rollout_id=, evaluation=]) -> Sample | None, given only the "
                       "keywords it declares; run after generation, before the reward; repeatable, run in order.")
    group.add_argument("--rollout-sample-filter-path", type=str, default=None,
                       help="fn(args, groups) called on the kept groups after the default rollout; it may set "
                       "sample.remove_sample (loss mask zeroed); its return is ignored.")
    group.add_argument("--rollout-all-samples-process-path", type=str, default=None,
                       help="fn(args, all_groups, get_samples) called after the default rollout with every "
                       "finished group, the filtered-out ones included; its return is ignored.")
    group.add_argument("--custom-rollout-log-function-path", type=str, default=None,
                       help="fn(rollout_id, args, samples, extra_metrics, rollout_time) -> bool; True skips "
                       "the default rollout/* metrics.")
    group.add_argument("--custom-eval-rollout-log-function-path", type=str, default=None,
                       help="fn(rollout_id, args, data, extra_metrics) -> bool; True skips the default eval/* metrics.")
    group.add_argument("--custom-convert-samples-to-train-data-path", type=str, default=None,
                       help="fn(args, samples) -> dict of train data (tokens, response_lengths, rewards, ...).")
    group.add_argument("--rollout-data-postprocess-path", type=str, default=None,
                       help="fn(args, rollout_id, rollout_data) mutating the rollout data before training.")


def _add_rewards(group) -> None:
    group.add_argument("--rm-type", type=str, choices=RM_TYPES, default=None,
                       help="Built-in reward; a boxed_ prefix scores the last \\boxed{} content. "
                       "A sample's metadata.rm_type overrides it.")
    group.add_argument("--reward-key", type=str, default=None, help="Key read when a reward is a dict.")
    group.add_argument("--eval-reward-key", type=str, default=None,
                       help="Key read from dict rewards at evaluation (None: --reward-key).")
    group.add_argument("--group-rm", action="store_true", default=False,
                       help="Call the reward function once per group: rm(args, samples) -> list.")
    group.add_argument("--rm-url", type=str, default=None, help="URL of the remote reward model (remote_rm).")
    group.add_argument("--custom-rm-path", type=str, default=None,
                       help="async rm(args, sample) -> float | dict (with --group-rm: rm(args, samples)).")
    group.add_argument("--custom-reward-post-process-path", type=str, default=None,
                       help="fn(args, samples) -> (raw_rewards, rewards) replacing group normalisation.")


def _add_weight_sync(group) -> None:
    group.add_argument("--update-weight-buffer-size", type=positive_int("--update-weight-buffer-size"),
                       default=512 * 1024**2, help="Bytes per weight-update bucket (default 512 MiB).")
    group.add_argument("--update-weights-interval", type=positive_int("--update-weights-interval"), default=1,
                       help="Push weights to the engines every this many rollouts (train.py also after the last; "
                       "must be 1 with --colocate).")
    group.add_argument("--use-fault-tolerance", action="store_true", default=False,
                       help="Health-check engines and restart dead ones instead of failing the run.")
    group.add_argument("--rollout-health-check-interval", type=float, default=2.0,
                       help="Seconds between engine health checks with --use-fault-tolerance.")


def _add_engines(group) -> None:
    group.add_argument("--rollout-engine", type=str, choices=("auto", "local", "sglang"), default="auto",
                       help="Rollout engine: SGLang servers, our local SGLang-compatible engine, or auto "
                            "(SGLang when the rollout bundles have GPUs and sglang imports, else local).")
    group.add_argument("--rollout-group-requests", action="store_true", default=False,
                       help="Send each prompt group's samples as one batched /generate (each with its own "
                       "sampling seed and budget: the same tokens) straight to an engine the router lists, "
                       "round robin per group, instead of one request per sample through the router. "
                       "Groups with a custom generate function or of one sample, and "
                       "--use-rollout-routing-replay, keep one request per sample.")
    group.add_argument("--rollout-log-dir", type=str, default=None,
                       help="Folder for engine and router logs (engine_<rank>.log); default: the actor's stdout.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the rollout flags as one argument group."""
    group = parser.add_argument_group("rollout", "Generation, rollout plugins, rewards and weight updates.")
    _add_sampling(group)
    _add_plugins(group)
    _add_rewards(group)
    _add_weight_sync(group)
    _add_engines(group)


def _validate_hf_checkpoint(args: argparse.Namespace, warnings: list[str]) -> None:
    if args.hf_checkpoint is None:
        if args.dry_run or args.debug_train_only:
            warnings.append("--hf-checkpoint not given: tokenizer and HF config checks skipped")
            return
        raise ArgumentError("--hf-checkpoint is required (tokenizer and engine weights)")
    if not check_path_exists(args, "--hf-checkpoint", args.hf_checkpoint, warnings):
        warnings.append("--hf-checkpoint missing: HF config cross-check of MODEL_ARGS skipped")
        return
    config_path = os.path.join(args.hf_checkpoint, "config.json")
    if not os.path.isfile(config_path):
        warnings.append(f"--hf-checkpoint {args.hf_checkpoint} has no config.json: MODEL_ARGS not cross-checked")
    # its comparison with MODEL_ARGS needs the model families: `slime.models.validate_hf_checkpoint`,
    # run by `parse_args` as its `model_check` (slime.utils does not import slime.models)


def validate(args: argparse.Namespace) -> list[str]:
    """--rollout-temperature > 0, --rollout-top-p in (0, 1], lengths > 0; remote_rm needs --rm-url; char_match
    needs --rollout-skip-special-tokens;
    --over-sampling-batch-size defaults to --rollout-batch-size and may not be smaller;
    --rollout-max-prompt-len < --rollout-max-context-len; --update-weights-interval 1 with --colocate;
    --rollout-group-requests with --custom-generate-function-path or --use-rollout-routing-replay warns
    that it has no effect;
    --hf-checkpoint is required (unless --dry-run or --debug-train-only) and must exist; its
    config.json, when present, must agree with MODEL_ARGS (slime.models.validate_hf_checkpoint, the
    entry points' model check, run after every domain)."""
    warnings: list[str] = []
    require(args.rollout_temperature > 0, f"--rollout-temperature must be > 0, got {args.rollout_temperature}")
    require(0 < args.rollout_top_p <= 1, f"--rollout-top-p must be in (0, 1], got {args.rollout_top_p}")
    for flag, value in (("--rollout-max-response-len", args.rollout_max_response_len),
                        ("--rollout-max-prompt-len", args.rollout_max_prompt_len),
                        ("--rollout-max-context-len", args.rollout_max_context_len)):
        require(value is None or value > 0, f"{flag} must be > 0, got {value}")
    if args.rollout_max_context_len is not None and args.rollout_max_prompt_len is not None:
        require(args.rollout_max_prompt_len < args.rollout_max_context_len,
                f"--rollout-max-prompt-len {args.rollout_max_prompt_len} leaves no room for a response in "
                f"--rollout-max-context-len {args.rollout_max_context_len}")
    if args.rm_type is not None and args.rm_type.endswith("remote_rm"):
        require(args.rm_url is not None, f"--rm-type {args.rm_type} needs --rm-url")
    if args.rm_type == "char_match":  # its stop's share needs the text to end where the answer does
        require(args.rollout_skip_special_tokens,
                "--rm-type char_match needs --rollout-skip-special-tokens (else the end-of-turn token's "
                "text is part of the response and stopping after the answer never counts)")
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    elif args.rollout_batch_size is not None:
        require(args.over_sampling_batch_size >= args.rollout_batch_size,
                f"--over-sampling-batch-size {args.over_sampling_batch_size} must be >= "
                f"--rollout-batch-size {args.rollout_batch_size}")
    require(args.update_weights_interval == 1 or not args.colocate,
            f"--update-weights-interval {args.update_weights_interval} needs 1 with --colocate (the engines give "
            "their weights' memory to the trainer and get them back by the sync after every rollout)")
    _validate_group_requests(args, warnings)
    _validate_hf_checkpoint(args, warnings)
    return warnings


def _validate_group_requests(args: argparse.Namespace, warnings: list[str]) -> None:
    """--rollout-group-requests is read by the default rollout's group generation only."""
    if not args.rollout_group_requests:
        return
    idle = []
    if args.custom_generate_function_path:
        idle.append(f"--custom-generate-function-path {args.custom_generate_function_path} generates every sample")
    if getattr(args, "use_rollout_routing_replay", False):
        idle.append("--use-rollout-routing-replay asks each request for routed experts")
    if idle:
        warnings.append("--rollout-group-requests has no effect: " + "; ".join(idle) + " (one request per sample)")
