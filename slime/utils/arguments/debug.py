"""Debug domain: --dry-run, running only one half of the loop, and saving or replaying rollout
data."""

from __future__ import annotations

import argparse

from slime.utils.arguments.common import ArgumentError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the debug flags as one argument group."""
    group = parser.add_argument_group("debug", "Dry runs and partial runs for debugging.")
    group.add_argument("--dry-run", action="store_true", default=False,
                       help="Parse and validate (missing paths become warnings), print the plan, and exit.")
    group.add_argument("--debug-rollout-only", action="store_true", default=False,
                       help="Run rollouts only; no trainer is created.")
    group.add_argument("--debug-train-only", action="store_true", default=False,
                       help="Train only; no engines are started (use with --load-debug-rollout-data).")
    group.add_argument("--save-debug-rollout-data", type=str, default=None, metavar="PATH{rollout_id}",
                       help="Save each rollout's data to this path, formatted with {rollout_id}.")
    group.add_argument("--load-debug-rollout-data", type=str, default=None, metavar="PATH{rollout_id}",
                       help="Replay rollout data saved by --save-debug-rollout-data; implies --debug-train-only.")
    group.add_argument("--traceback", action="store_true", default=False,
                       help="Let a failed job end with Python's full traceback. Default: one line naming the root "
                            "cause, the traceback appended to <--metrics-dir>/error.log.")
    group.add_argument("--check-weight-update-equal", action="store_true", default=False,
                       help="After a weight update, compare the engines' weights with the trainer's.")


def _check_format(flag: str, template: str | None) -> None:
    if template is None:
        return
    try:
        template.format(rollout_id=0)
    except (KeyError, IndexError, ValueError) as error:
        raise ArgumentError(f"{flag} {template!r} must be a format string with only {{rollout_id}}: {error!r}")


def validate(args: argparse.Namespace) -> list[str]:
    """--save/--load-debug-rollout-data must be format strings using only {rollout_id};
    --load-debug-rollout-data turns on --debug-train-only; --debug-rollout-only and
    --debug-train-only exclude each other."""
    warnings: list[str] = []
    _check_format("--save-debug-rollout-data", args.save_debug_rollout_data)
    _check_format("--load-debug-rollout-data", args.load_debug_rollout_data)
    if args.load_debug_rollout_data is not None and not args.debug_train_only:
        args.debug_train_only = True
        warnings.append("--load-debug-rollout-data turns on --debug-train-only")
    if args.debug_rollout_only and args.debug_train_only:
        raise ArgumentError("--debug-rollout-only and --debug-train-only exclude each other")
    return warnings
