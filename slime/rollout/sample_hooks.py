"""slime's `--rollout-sample-hook-path` API: hooks run on each generated sample before its reward.

`apply_rollout_sample_hooks(args, value, **kw)` runs every hook in order on a Sample or on a
nested list of Samples (shape kept). Each hook is `hook(args, sample, **kw)` with `kw` cut to the
keywords it declares; `rollout_id` defaults to the id set by `set_current_rollout_id`, which the
rollout manager's call of the rollout function sets (kept in a context variable, not a global).
"""

from __future__ import annotations

from slime.utils.misc import load_function
from slime.utils.plugins import call_sample_hook, current_rollout_id, set_current_rollout_id
from slime.utils.types import Sample

__all__ = ["apply_rollout_sample_hooks", "set_current_rollout_id", "current_rollout_id"]


async def _apply(hooks, args, value, kwargs):
    if isinstance(value, Sample):
        for hook in hooks:
            value = await call_sample_hook(hook, args, value, **kwargs)
        return value
    if isinstance(value, list):
        return [await _apply(hooks, args, item, kwargs) for item in value]
    raise TypeError(f"rollout sample hooks take a Sample or a (nested) list of Samples, got {type(value).__name__}")


async def apply_rollout_sample_hooks(args, value, **kwargs):
    """Run the `--rollout-sample-hook-path` hooks on `value` (Sample or nested list); returns the
    same shape. Without hooks `value` comes back unchanged."""
    paths = getattr(args, "rollout_sample_hook_path", None) or []
    if not paths:
        return value
    kwargs.setdefault("rollout_id", current_rollout_id())
    return await _apply([load_function(p) for p in paths], args, value, kwargs)
