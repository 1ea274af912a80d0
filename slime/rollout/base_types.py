"""Return types of rollout and eval functions (`--rollout-function-path`, `--eval-function-path`).

User plugins import `RolloutFnTrainOutput` and `RolloutFnEvalOutput` from here (slime's path).
The classes are defined in `slime.utils.types` so that `slime.utils.plugins` can check them
without importing `slime.rollout`; this module re-exports the same objects.

`call_rollout_fn` is slime's helper of the same name: it calls a rollout function and wraps a
bare return without checking it. The rollout manager uses the checking
`slime.utils.plugins.call_rollout_fn` instead.
"""

from slime.utils.types import RolloutFnEvalOutput, RolloutFnTrainOutput

__all__ = ["RolloutFnTrainOutput", "RolloutFnEvalOutput", "call_rollout_fn"]


def call_rollout_fn(fn, *args, evaluation: bool, **kwargs):
    """`fn(*args, **kwargs, evaluation=evaluation)`; a return that is not an output class is
    wrapped as is: `RolloutFnEvalOutput(data=out)` when evaluating, else
    `RolloutFnTrainOutput(samples=out)`."""
    out = fn(*args, **kwargs, evaluation=evaluation)
    if isinstance(out, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        return out
    return RolloutFnEvalOutput(data=out) if evaluation else RolloutFnTrainOutput(samples=out)
