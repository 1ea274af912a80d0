"""Return type of dynamic sampling filters (`--dynamic-sampling-filter-path`).

`DynamicFilterOutput(keep: bool, reason: str | None = None)` is defined in `slime.utils.types`
(so `slime.utils.plugins` can check it without importing `slime.rollout`) and re-exported here,
the path slime users import it from.
"""

from slime.utils.types import DynamicFilterOutput

__all__ = ["DynamicFilterOutput"]
