"""Built-in dynamic sampling filters for `--dynamic-sampling-filter-path`.

A filter sees one group of samples (all responses to one prompt) and decides whether the group is
kept for training.
"""

from __future__ import annotations

import torch

from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils.types import Sample


def check_reward_nonzero_std(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """Keep a group only if its rewards are not all equal (std > 0).

    Groups whose samples all got the same reward give zero GRPO advantage, so they carry no
    learning signal. Rewards are read with `Sample.get_reward_value(args)` (honours --reward-key).
    """
    if not samples:
        raise ValueError("check_reward_nonzero_std got an empty sample group")
    rewards = torch.tensor([float(s.get_reward_value(args)) for s in samples], dtype=torch.float64)
    keep = rewards.numel() > 1 and bool(rewards.std() > 0.0)
    if keep:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"zero_std_{round(rewards[0].item(), 1)}")


def check_reward_nonzero_std_with_fallback(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """`check_reward_nonzero_std`, but a dropped group may still fill the batch when the prompts
    run out (`keep_when_insufficient`)."""
    out = check_reward_nonzero_std(args, samples, **kwargs)
    if not out.keep:
        out.keep_when_insufficient = True
    return out
