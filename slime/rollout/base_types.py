"""Return types of rollout and eval functions (`--rollout-function-path`, `--eval-function-path`).

User plugins import `RolloutFnTrainOutput` and `RolloutFnEvalOutput` from here (slime's path).
The classes are defined in `slime.utils.types` so that `slime.utils.plugins` can check them
without importing `slime.rollout`; this module re-exports the same objects.
"""

from slime.utils.types import RolloutFnEvalOutput, RolloutFnTrainOutput

__all__ = ["RolloutFnTrainOutput", "RolloutFnEvalOutput"]
