"""Return type of dynamic sampling filters (`--dynamic-sampling-filter-path`) and slime's helpers.

`DynamicFilterOutput(keep, reason=None, keep_when_insufficient=False)` is defined in
`slime.utils.types` (so `slime.utils.plugins` can check it without importing `slime.rollout`) and
re-exported here, the path slime users import it from. A group dropped with
`keep_when_insufficient=True` is still used when the prompts run out before
`--rollout-batch-size` groups were kept.
"""

from slime.utils.plugins import call_dynamic_filter
from slime.utils.types import DynamicFilterOutput

__all__ = ["DynamicFilterOutput", "call_dynamic_filter", "should_drop_dynamic_filter_output"]


def should_drop_dynamic_filter_output(output: DynamicFilterOutput) -> bool:
    """Whether a filter verdict drops its group."""
    return not output.keep
