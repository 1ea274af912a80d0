"""Numbers that can only be mistakes: a negative learning rate, a clip range outside (0, 1], ...

`RANGES` is the registry: dest -> (test, what the value must be, error or warning). A flag that is
unset (None) is not checked.
"""

from __future__ import annotations

from typing import Callable

from slime.utils.preflight.report import Report


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _at_least(low: float) -> Callable[[float], bool]:
    return lambda v: v >= low


def _in(low: float, high: float, low_open: bool = True, high_open: bool = False) -> Callable[[float], bool]:
    return lambda v: (v > low if low_open else v >= low) and (v < high if high_open else v <= high)


# dest -> (accepts(value), "must be ...", severity)
RANGES: dict[str, tuple[Callable[[float], bool], str, str]] = {
    "lr": (_at_least(0.0), ">= 0", "error"),
    "min_lr": (_at_least(0.0), ">= 0", "error"),
    "critic_lr": (_at_least(0.0), ">= 0", "error"),
    "weight_decay": (_at_least(0.0), ">= 0", "error"),
    "clip_grad": (_at_least(0.0), ">= 0 (0: no clipping)", "error"),
    "adam_beta1": (_in(0.0, 1.0, low_open=False, high_open=True), "in [0, 1)", "error"),
    "adam_beta2": (_in(0.0, 1.0, low_open=False, high_open=True), "in [0, 1)", "error"),
    "adam_eps": (_in(0.0, float("inf")), "> 0", "error"),
    "eps_clip": (_in(0.0, 1.0), "in (0, 1]", "error"),
    "eps_clip_high": (_in(0.0, 1.0), "in (0, 1]", "error"),
    "kl_loss_coef": (_at_least(0.0), ">= 0", "error"),
    "kl_coef": (_at_least(0.0), ">= 0", "error"),
    "entropy_coef": (_at_least(0.0), ">= 0 (a negative coefficient penalises exploration)", "warning"),
    "rollout_temperature": (_at_least(0.0), ">= 0", "error"),
    "rollout_top_p": (_in(0.0, 1.0), "in (0, 1]", "error"),
    "eval_top_p": (_in(0.0, 1.0), "in (0, 1]", "error"),
    "gamma": (_in(0.0, 1.0, low_open=False), "in [0, 1]", "error"),
    "lambd": (_in(0.0, 1.0, low_open=False), "in [0, 1]", "error"),
}


def check_ranges(args, report: Report) -> None:
    """Every set flag of `RANGES` holds a value it accepts; `--min-lr` above `--lr` is a warning."""
    for dest, (accepts, must, severity) in RANGES.items():
        value = getattr(args, dest, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not accepts(value):
            (report.error if severity == "error" else report.warn)(
                _flag(dest), f"{value} must be {must}", "a value outside this range can only be a typo")
    lr, min_lr = getattr(args, "lr", None), getattr(args, "min_lr", None)
    if isinstance(lr, (int, float)) and isinstance(min_lr, (int, float)) and min_lr > lr >= 0:
        report.warn("--min-lr", f"{min_lr} is above --lr {lr}: the learning rate would grow while it decays")
