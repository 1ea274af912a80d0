"""A reward must be a finite number, or a dict whose numeric values are finite.

`checked_reward` raises `RewardValueError` naming the flag that chose the reward function
(`--custom-rm-path PATH`, `--rm-type NAME`, or the sample's metadata `rm_type`), the sample's
index and the value, instead of letting a NaN reach the advantage and the metrics.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


class RewardValueError(ValueError):
    """A reward function returned a NaN, an infinity or a value that is not a reward."""


def _problem(value: Any) -> str | None:
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, numbers.Real) and not math.isfinite(item):
                return f"a dict whose {key!r} is {item!r}"
        return None
    if isinstance(value, numbers.Real):
        return None if math.isfinite(value) else repr(value)
    return f"{type(value).__name__} {repr(value)[:100]}"


def checked_reward(value: Any, *, source: str, sample) -> Any:
    """`value` unchanged when it is a finite number or a dict with finite numeric values; else
    RewardValueError naming `source` (e.g. "--custom-rm-path my.rm") and `sample`'s index."""
    problem = _problem(value)
    if problem is None:
        return value
    index = getattr(sample, "index", None)
    where = f"sample {index}" if index is not None else "a sample"
    group = getattr(sample, "group_index", None)
    where += f" (group {group})" if group is not None else ""
    raise RewardValueError(f"{source} returned {problem} for {where}: a reward must be a finite number "
                           "or a dict of them")
