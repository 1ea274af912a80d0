"""Logging domain: the metrics directory and the wandb / tensorboard sinks. ``is_secret_dest`` (the
one definition of a secret flag: ``SECRET_DESTS`` plus API keys, tokens and passwords of the
passthrough flags) names dests whose values must never be printed or saved (plans, config dumps,
wandb config, checkpoint args)."""

from __future__ import annotations

import argparse
import re

SECRET_DESTS = ("wandb_key",)
_SECRET_NAME = re.compile(r"(^|_)(api_key|token|secret|password)$")


def is_secret_dest(dest: str) -> bool:
    """Whether the value of args.`dest` is a credential (e.g. wandb_key, sglang_api_key)."""
    return dest in SECRET_DESTS or bool(_SECRET_NAME.search(dest))
WANDB_MODES = ("online", "offline", "disabled")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the logging flags as one argument group."""
    group = parser.add_argument_group("logger", "Metrics sinks: jsonl, wandb, tensorboard.")
    group.add_argument("--metrics-dir", type=str, default=None,
                       help="Directory for metrics.jsonl (and tensorboard events); default runs/latest under the "
                            "working directory.")
    group.add_argument("--use-wandb", action="store_true", default=False, help="Log metrics to Weights & Biases.")
    group.add_argument("--wandb-mode", type=str, choices=WANDB_MODES, default=None,
                       help="wandb mode (None: wandb's own default / WANDB_MODE).")
    group.add_argument("--wandb-project", type=str, default=None, help="wandb project.")
    group.add_argument("--wandb-group", type=str, default=None, help="wandb group of the run.")
    group.add_argument("--wandb-team", type=str, default=None, help="wandb entity (team).")
    group.add_argument("--wandb-host", type=str, default=None, help="wandb server URL.")
    group.add_argument("--wandb-key", type=str, default=None,
                       help="wandb API key (secret: never printed). Prefer exporting WANDB_API_KEY: a command "
                            "line is visible in ps and in Ray's job records.")
    group.add_argument("--wandb-dir", type=str, default=None, help="Local directory for wandb files.")
    group.add_argument("--use-tensorboard", action="store_true", default=False, help="Log metrics to tensorboard.")
    group.add_argument("--tb-project-name", type=str, default=None, help="Tensorboard project directory name.")
    group.add_argument("--tb-experiment-name", type=str, default=None, help="Tensorboard experiment name.")


def validate(args: argparse.Namespace) -> list[str]:
    """Warn when sink options come without their sink switch."""
    warnings: list[str] = []
    wandb_only = [flag for flag, value in (("--wandb-project", args.wandb_project),
                                           ("--wandb-key", args.wandb_key)) if value is not None]
    if wandb_only and not args.use_wandb:
        warnings.append(f"{', '.join(wandb_only)} given without --use-wandb: wandb is off")
    if args.wandb_key is not None:
        warnings.append("--wandb-key puts the key on a command line (visible in ps and in Ray's job records): "
                        "export WANDB_API_KEY instead")
    if args.tb_project_name is not None and not args.use_tensorboard:
        warnings.append("--tb-project-name given without --use-tensorboard: tensorboard is off")
    return warnings
