"""slime's command line: one parser assembled from domain modules, validated once at parse time.

Each domain module in ``DOMAINS`` has ``add_arguments(parser)`` (one argument group) and
``validate(args) -> list[str]`` (warnings; raises ``ArgumentError`` naming the flags). Validators
run in ``DOMAINS`` order, which is also their dependency order: debug switches first, the cluster
and the Megatron layout before batch arithmetic, the rollout values before eval falls back on them.
The cross-check of MODEL_ARGS against --hf-checkpoint's config.json needs the model families,
which sit above this package (`slime.models`): the entry points hand it to `parse_args` as
``model_check`` (`slime.models.validate_hf_checkpoint`), run after every domain's validator.
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType
from typing import Any, Callable

from slime.utils.arguments import (
    algorithm,
    checkpoint,
    cluster,
    critic,
    custom_config,
    data,
    debug,
    features,
    logger as logger_domain,
    megatron,
    opd,
    rollout,
    sglang,
)
from slime.utils.arguments import eval as eval_domain
from slime.utils.arguments.common import ArgumentError
from slime.utils.arguments.logger import SECRET_DESTS, is_secret_dest

__all__ = ["ArgumentError", "DOMAINS", "ENTRIES", "SECRET_DESTS", "is_secret_dest", "build_parser", "parse_args",
           "redacted_vars", "startup_refusals", "validate_args"]

# `model_check(args) -> list[str]`: warnings; raises ArgumentError naming the flags
ModelCheck = Callable[[argparse.Namespace], list]

# Not named `logger`: that name is the logging domain submodule of this package.
log = logging.getLogger(__name__)

DOMAINS: tuple[ModuleType, ...] = (
    debug, cluster, megatron, features, data, rollout, eval_domain, algorithm, opd, critic, checkpoint, logger_domain,
    sglang, custom_config,
)
ENTRIES = ("train", "train_async")


class _OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and a hint to --help (no usage dump), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(entry: str = "train") -> argparse.ArgumentParser:
    """Return the parser of entry point ``entry`` ("train" or "train_async"): one argument group per
    domain of ``DOMAINS``; unknown flags are an error."""
    if entry not in ENTRIES:
        raise ValueError(f"entry must be one of {ENTRIES}, got {entry!r}")
    parser = _OneLineParser(
        prog=f"{entry}.py", description=f"slime {entry}: RL post-training with Megatron and SGLang.",
        allow_abbrev=False,
    )
    parser.set_defaults(entry=entry)
    for domain in DOMAINS:
        domain.add_arguments(parser)
    return parser


def validate_args(args: argparse.Namespace, model_check: ModelCheck | None = None) -> list[str]:
    """Run every domain's validator once, in ``DOMAINS`` order, then ``model_check`` (the entry
    points': `slime.models.validate_hf_checkpoint`); return all warnings.

    Validators may resolve derived values in place (e.g. --eps-clip-high, --global-batch-size).
    Raises ArgumentError naming the flags of the first violated rule.
    """
    warnings: list[str] = []
    for domain in DOMAINS:
        warnings.extend(domain.validate(args))
    if model_check is not None:
        warnings.extend(model_check(args))
    return warnings


def parse_args(argv: list[str] | None = None, entry: str = "train",
               model_check: ModelCheck | None = None) -> argparse.Namespace:
    """Parse ``argv`` (None: sys.argv[1:]) for ``entry``, validate, log the warnings.

    ``--sglang-config YAML`` items are merged into ``argv`` first (``sglang.expand_sglang_config``);
    ``--custom-config-path YAML`` keys override the parsed values before validation.
    ``model_check``: the cross-check of MODEL_ARGS against the model families, run last
    (`validate_args`); train.py passes `slime.models.validate_hf_checkpoint`.
    Returns the namespace with ``args.entry`` and ``args.warnings`` (list of str) set.
    Unknown flags exit through argparse naming the flag; invalid combinations raise ArgumentError.
    """
    argv = sglang.expand_sglang_config(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(entry)
    args = parser.parse_args(argv)
    custom_config.apply_custom_config(args, parser)
    args.warnings = validate_args(args, model_check)
    for warning in args.warnings:
        log.warning("%s", warning)
    return args


def redacted_vars(args: argparse.Namespace) -> dict[str, Any]:
    """``vars(args)`` with every secret dest (``is_secret_dest``) that is set replaced by
    "<redacted>"; for printing plans and config dumps."""
    return {k: "<redacted>" if v is not None and is_secret_dest(k) else v for k, v in vars(args).items()}


def startup_refusals(args: argparse.Namespace, cuda_available: bool | None = None) -> list[str]:
    """Flags this run cannot honor, one line each naming the flag and why: GPU-only features on a
    machine without CUDA and features not implemented in the requested configuration. Collected
    from every domain that defines ``startup_refusals(args, cuda_available)``; the entry points
    refuse to start on any (``--dry-run`` shows the flags in the plan instead).
    ``cuda_available`` None: ask torch."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    refusals: list[str] = []
    for domain in DOMAINS:
        check = getattr(domain, "startup_refusals", None)
        if check is not None:
            refusals.extend(check(args, cuda_available))
    return refusals
