"""Advantages and returns on a rank's share of the rollout: the per-sample inputs gathered from
`rollout_data`, the estimator run on them, the results scattered back (None for the samples
another data-parallel rank trains on). Shared by the actor and the PPO critic.
"""

from __future__ import annotations

import torch

from slime.backends.megatron_utils import collectives
from slime.utils.advantages import compute_advantages_and_returns, masked_moments, whiten_from_moments


def _per_sample(rollout_data: dict, key: str, mine: list[int]) -> list[torch.Tensor] | None:
    if key not in rollout_data:
        return None
    return [torch.as_tensor(rollout_data[key][i], dtype=torch.float32) for i in mine]


def estimate(rollout_data: dict, mine: list[int], estimator: str, **opts) -> tuple[list, list]:
    """(advantages, returns), one entry per sample of `rollout_data` (None outside `mine`), from
    `compute_advantages_and_returns(estimator, ...)` on the samples `mine`; `opts` are its options."""
    advantages, returns = compute_advantages_and_returns(
        estimator,
        rewards=[float(rollout_data["rewards"][i]) for i in mine],
        loss_masks=_per_sample(rollout_data, "loss_masks", mine),
        response_lengths=[rollout_data["response_lengths"][i] for i in mine],
        total_lengths=[len(rollout_data["tokens"][i]) for i in mine],
        log_probs=_per_sample(rollout_data, "log_probs", mine),
        ref_log_probs=_per_sample(rollout_data, "ref_log_probs", mine),
        values=_per_sample(rollout_data, "values", mine),  # ppo: the critic's (slime.ray.critic)
        **opts,
    )
    n = len(rollout_data["tokens"])
    all_advantages, all_returns = [None] * n, [None] * n
    for k, i in enumerate(mine):
        all_advantages[i], all_returns[i] = advantages[k], returns[k]
    return all_advantages, all_returns


def whiten_over_group(advantages: list[torch.Tensor], loss_masks: list[torch.Tensor], group) -> list[torch.Tensor]:
    """`--normalize-advantages`: whiten per-sample advantages with the mean and variance of every
    loss-masked token of all ranks of `group` (sum, sum of squares and count all-reduced). A rank
    with no samples still joins the all-reduce. Returns the whitened tensors in input order."""
    if advantages:
        moments = masked_moments(torch.cat(advantages), torch.cat(loss_masks))
    else:
        moments = torch.zeros(3, dtype=torch.float64)
    moments = collectives.all_reduce(collectives.to_device(moments), group=group).cpu()  # advantages stay on the host
    return [whiten_from_moments(adv, moments) for adv in advantages]


def whiten_advantages(rollout_data: dict, mine: list[int], group) -> None:
    """`rollout_data["advantages"]` of the samples `mine` whitened over `group` in place."""
    whitened = whiten_over_group(_per_sample(rollout_data, "advantages", mine),
                                 _per_sample(rollout_data, "loss_masks", mine), group)
    for i, adv in zip(mine, whitened):
        rollout_data["advantages"][i] = adv
