"""Reward hub: turns a finished `Sample` into a reward (slime-compatible `async_rm` API).

Owns the entry points users import, `async_rm(args, sample, **kwargs)` and
`batched_async_rm(args, samples, **kwargs)`. The reward comes from, in order: the custom
function at `sample.custom_rm_path` or `--custom-rm-path` (`async def rm(args, sample)`), else
the built-in type named by `sample.metadata["rm_type"]`, else `--rm-type` (see `registry`).
`batched_async_rm` with `--custom-rm-path` calls the custom function once with the whole list
(`async def rm(args, samples) -> list`; the rollout uses it per group with `--group-rm`); with a
built-in type the samples are scored one by one.

`args` fields read: `rm_type`, `custom_rm_path`, `group_rm`, `rm_url` (remote_rm). Dict rewards
(e.g. `dapo`) are returned whole; `Sample.get_reward_value(args)` picks `--reward-key` later.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from slime.rollout.rm_hub.checks import RewardValueError, checked_reward
from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score
from slime.rollout.rm_hub.gpqa import compute_gpqa_reward
from slime.rollout.rm_hub.math_dapo import compute_score as compute_score_dapo
from slime.rollout.rm_hub.math_utils import extract_answer as extract_boxed_answer
from slime.rollout.rm_hub.math_utils import grade_answer_verl
from slime.rollout.rm_hub.registry import UnknownRewardTypeError, get_reward_fn, known_rm_types, local_score_fn
from slime.rollout.rm_hub.remote_rm import remote_rm
from slime.utils.misc import load_function
from slime.utils.plugins import call_reward_fn

# slime re-exports these graders from the package; `remote_rm` here is the function.
__all__ = [
    "async_rm", "async_rm_each", "batched_async_rm", "resolve_rm_type", "RewardValueError", "remote_rm", "get_deepscaler_rule_based_reward",
    "f1_score", "compute_gpqa_reward", "compute_score_dapo", "extract_boxed_answer", "grade_answer_verl",
]


def resolve_rm_type(args, sample) -> str:
    """The built-in reward type for `sample`: metadata["rm_type"] overrides `--rm-type`."""
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = metadata.get("rm_type") or args.rm_type
    if not rm_type:
        raise UnknownRewardTypeError(
            "no reward model configured: set --rm-type (one of "
            f"{', '.join(known_rm_types())}) or --custom-rm-path, or put 'rm_type' in the "
            "sample's metadata"
        )
    return str(rm_type)


async def _call_custom(path: str, args, sample_or_samples, **kwargs) -> Any:
    """Call the custom reward function at `path` (async, or sync for convenience). One sample's
    reward is checked by the plugin layer; a group's count is checked by `batched_async_rm`."""
    fn = load_function(path)
    if isinstance(sample_or_samples, list):
        out = fn(args, sample_or_samples, **kwargs)
        return await out if inspect.isawaitable(out) else out
    return await call_reward_fn(fn, args, sample_or_samples, **kwargs)


async def async_rm(args, sample, **kwargs) -> Any:
    """Reward of one sample: a float, or a dict for dict-valued types (`dapo`, custom, remote).

    `kwargs` go to the custom function or to `remote_rm` (`max_attempts`, `base_delay`,
    `timeout`). Raises UnknownRewardTypeError (ValueError and NotImplementedError, as slime) for a
    missing or unknown reward type, RewardValueError (naming the flag and the sample's index) for
    a NaN, an infinity or a value that is not a reward.
    """
    custom_path = getattr(sample, "custom_rm_path", None) or args.custom_rm_path
    if custom_path:
        reward = await _call_custom(custom_path, args, sample, **kwargs)
        return checked_reward(reward, source=f"--custom-rm-path {custom_path}", sample=sample)
    rm_type = resolve_rm_type(args, sample)
    reward = await get_reward_fn(rm_type)(args, sample, **kwargs)
    return checked_reward(reward, source=f"--rm-type {rm_type}", sample=sample)


async def async_rm_each(args, samples: list) -> list:
    """`[await async_rm(args, s) for s in samples]`, concurrently, in order; the samples a pure local
    type scores (`registry.local_score_fn`) are scored together in one worker thread instead of
    one thread hop each (256 hops cost about 20 ms per rollout of the CPU toy job)."""
    rewards: list = [None] * len(samples)
    local: list[tuple[int, Any, str]] = []  # (index, score function, rm_type)
    others: list[int] = []
    scorers: dict[str, Any] = {}  # rm_type -> its local score function (None: not a local type)
    for i, sample in enumerate(samples):
        custom = getattr(sample, "custom_rm_path", None) or args.custom_rm_path
        rm_type = None if custom else resolve_rm_type(args, sample)
        if rm_type is not None and rm_type not in scorers:
            scorers[rm_type] = local_score_fn(rm_type)
        score = scorers.get(rm_type)  # None for a custom or remote reward
        if score is not None:
            local.append((i, score, rm_type))
        else:
            others.append(i)

    def score_local() -> list:
        return [score(samples[i]) for i, score, _ in local]

    local_rewards, other_rewards = await asyncio.gather(
        asyncio.to_thread(score_local) if local else asyncio.sleep(0, []),
        asyncio.gather(*(async_rm(args, samples[i]) for i in others)))
    for (i, _, rm_type), reward in zip(local, local_rewards):
        rewards[i] = checked_reward(reward, source=f"--rm-type {rm_type}", sample=samples[i])
    for i, reward in zip(others, other_rewards):
        rewards[i] = reward
    return rewards


async def batched_async_rm(args, samples: list, **kwargs) -> list:
    """Rewards of `samples`, in order.

    With `--custom-rm-path` the custom function is awaited once with the whole list (as in slime,
    with or without `--group-rm`) and must return one reward per sample. Otherwise `async_rm`
    runs for every sample concurrently.
    """
    if args.custom_rm_path:
        rewards = await _call_custom(args.custom_rm_path, args, samples, **kwargs)
        if len(rewards) != len(samples):
            raise ValueError(
                f"--custom-rm-path {args.custom_rm_path} returned {len(rewards)} rewards for "
                f"{len(samples)} samples (a list call expects one per sample)"
            )
        return [checked_reward(r, source=f"--custom-rm-path {args.custom_rm_path}", sample=s)
                for r, s in zip(rewards, samples)]
    if kwargs:
        return list(await asyncio.gather(*(async_rm(args, sample, **kwargs) for sample in samples)))
    return await async_rm_each(args, samples)
