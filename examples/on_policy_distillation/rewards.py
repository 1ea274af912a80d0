"""Reward of the distillation-only run (DISTILL_ONLY=1 in run-opd-tiny-cpu.sh): a dict whose
`task` entry is the toy task's score (the `math` reward: exact match of the answer), kept for
evaluation (`--eval-reward-key task`), and whose `train` entry (`--reward-key train`) is 0 for
every sample. Every GRPO group then has equal rewards and zero advantages, so the teacher's
per-token term is the only training signal."""

from __future__ import annotations

from slime.rollout.rm_hub import get_reward_fn


async def distill_only(args, sample, **kwargs) -> dict:
    """{"task": the math reward of `sample`, "train": 0.0}."""
    task = await get_reward_fn("math")(args, sample)
    return {"task": float(task), "train": 0.0}
