"""Checkpoint domain: Megatron torch_dist load/save (Megatron-LM flag names and dests), the
reference model checkpoint, and the Hugging Face export."""

from __future__ import annotations

import argparse
import os

from slime.utils.arguments.common import check_path_exists, positive_int, require

CKPT_FORMATS = ("torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the checkpoint flags as one argument group."""
    group = parser.add_argument_group("checkpoint", "Loading and saving checkpoints.")
    group.add_argument("--load", type=str, default=None,
                       help="Megatron checkpoint directory to resume from; without "
                       "latest_checkpointed_iteration.txt the run starts from --ref-load (weights only).")
    group.add_argument("--save", type=str, default=None, help="Directory to save Megatron checkpoints to.")
    group.add_argument("--overwrite-run", action="store_true", default=False,
                       help="Start afresh in a run folder (--metrics-dir, --save) that already holds a run: the old "
                            "metrics.jsonl is kept as metrics.jsonl.replaced-<time>, new checkpoints replace the old "
                            "ones as they are saved. Without it such a launch is refused unless it resumes the run "
                            "(--load equal to --save).")
    group.add_argument("--save-interval", type=positive_int("--save-interval"), default=None,
                       help="Save every this many rollouts (None: never).")
    group.add_argument("--ref-load", type=str, default=None,
                       help="Megatron checkpoint of the reference model (and the actor's start without --load).")
    group.add_argument("--save-hf", type=str, default=None,
                       help="Also export Hugging Face weights to this path (format string with {rollout_id}).")
    group.add_argument("--no-save-optim", action="store_true", default=None,
                       help="Do not save optimizer state.")
    group.add_argument("--no-load-optim", action="store_true", default=None,
                       help="Do not load optimizer state.")
    group.add_argument("--no-load-rng", action="store_true", default=None, help="Do not load RNG state.")
    group.add_argument("--finetune", action="store_true", default=False,
                       help="Load weights only and reset the iteration count (Megatron-LM meaning).")
    group.add_argument("--async-save", action="store_true", default=None,
                       help="Write checkpoints in the background (torch_dist).")
    group.add_argument("--ckpt-format", type=str, choices=CKPT_FORMATS, default="torch_dist",
                       help="Megatron checkpoint format; only torch_dist is implemented (the others are "
                       "Megatron-LM's names, refused with an error).")
    group.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
                       dest="use_checkpoint_opt_param_scheduler", action="store_true", default=False,
                       help="Take learning-rate scheduler settings from the checkpoint.")
    group.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler",
                       dest="override_opt_param_scheduler", action="store_true", default=False,
                       help="Take learning-rate scheduler settings from the flags, ignoring the checkpoint's "
                            "(e.g. resuming with a different --num-rollout).")


def validate(args: argparse.Namespace) -> list[str]:
    """--ckpt-format must be torch_dist (the one format written and read); --ref-load must exist;
    --load must exist unless --ref-load is given (then a missing --load is a first run that starts
    from --ref-load, with a warning)."""
    warnings: list[str] = []
    require(args.ckpt_format == "torch_dist",
            f"--ckpt-format {args.ckpt_format} is not implemented: checkpoints are Megatron torch_dist only")
    if args.ref_load is not None:
        check_path_exists(args, "--ref-load", args.ref_load, warnings)
    if args.load is not None and args.ref_load is not None:
        if not os.path.exists(args.load):
            warnings.append(f"--load {args.load} does not exist yet: the actor starts from --ref-load "
                            f"{args.ref_load}")
    elif args.load is not None:
        check_path_exists(args, "--load", args.load, warnings)
    if args.save_interval is not None and args.save is None:
        warnings.append("--save-interval without --save: nothing is saved")
    return warnings
