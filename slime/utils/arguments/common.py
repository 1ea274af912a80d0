"""Shared pieces of the argument package: the error type, path checks and parallel-layout math.

Domain modules import from here (never from the package ``__init__``) so that the package can
import every domain module without cycles.
"""

from __future__ import annotations

import argparse
import os
import re

DEFAULT_ROLLOUT_FUNCTION = "slime.rollout.sglang_rollout.generate_rollout"
_SLICE_SUFFIX = re.compile(r"@\[[^\]]*\]$")


class ArgumentError(ValueError):
    """A flag combination is invalid; the message names the flags involved."""


def strip_slice(path: str) -> str:
    """Return ``path`` without a trailing ``@[start:end]`` slice (``--prompt-data`` syntax)."""
    return _SLICE_SUFFIX.sub("", path)


def check_path_exists(args: argparse.Namespace, flag: str, path: str, warnings: list[str]) -> bool:
    """Check that ``path`` (given by ``flag``) exists.

    Returns True when it exists. When it does not, raises ArgumentError, or with ``--dry-run``
    appends a warning to ``warnings`` and returns False.
    """
    if os.path.exists(path):
        return True
    message = f"{flag} {path}: no such file or directory"
    if getattr(args, "dry_run", False):
        warnings.append(message + " (ignored by --dry-run)")
        return False
    raise ArgumentError(message)


def check_load(args: argparse.Namespace, flag: str, path, save, fresh: str, warnings: list[str]) -> None:
    """Check a checkpoint flag (`--load`, `--ref-load`, `--critic-load`) before start-up: `path`
    must hold a complete checkpoint (`checkpoint_layout.load_problem`: the error names the flag,
    the folder and what is missing), except slime's first launch (`path` is the `save` folder and
    holds no checkpoint yet), which appends the warning "...: `fresh`". With ``--dry-run`` a
    problem is a warning."""
    from slime.utils.checkpoint_layout import first_launch, load_problem

    if path is None:
        return
    if first_launch(path, save):
        warnings.append(f"{flag} {path} is the save folder and holds no checkpoint yet (a first launch): {fresh}")
        return
    if not check_path_exists(args, flag, path, warnings):
        return
    problem = load_problem(flag, path, save)
    if problem is None:
        return
    if getattr(args, "dry_run", False):
        warnings.append(problem + " (ignored by --dry-run)")
        return
    raise ArgumentError(problem)


def require(condition: bool, message: str) -> None:
    """Raise ArgumentError(message) unless ``condition`` holds."""
    if not condition:
        raise ArgumentError(message)


def world_size(args: argparse.Namespace) -> int:
    """Number of training ranks: ``--actor-num-nodes`` x ``--actor-num-gpus-per-node``."""
    return args.actor_num_nodes * args.actor_num_gpus_per_node


def data_parallel_size(args: argparse.Namespace) -> int:
    """Training data-parallel size: world size / (TP x PP x CP); assumes the layout validated."""
    model_parallel = (
        args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.context_parallel_size
    )
    return world_size(args) // model_parallel


def positive_int(flag: str):
    """Argparse ``type`` for an integer >= 1; the error names ``flag``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be >= 1, got {text}")
        return value

    parse.__name__ = "positive int"
    return parse
