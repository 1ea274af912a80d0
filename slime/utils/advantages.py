"""Group reward post-processing, advantage estimators and advantage whitening.

Owns the `--advantage-estimator` registry (grpo, gspo, cispo, reinforce_plus_plus,
reinforce_plus_plus_baseline, ppo) and the group normalisation of rewards that GRPO-style
estimators apply before it. Inputs are per-sample lists of per-token tensors over response tokens
only; the math itself lives in `slime.utils.ppo_utils`. Whitening is split into a moments helper
(sums and a count) and an apply step, so a data-parallel caller all-reduces the moments in between.
On-policy distillation (`--use-opd`) adds the teacher's per-token signal to the advantages
(`apply_opd_advantages`).
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import torch

from slime.utils import ppo_utils

logger = logging.getLogger(__name__)

# Estimators whose rewards get the group mean subtracted, and whether --disable-grpo-std-normalization
# applies (i.e. whether they divide by the group std by default).
_GROUP_NORMALIZED = {
    "grpo": True,
    "gspo": True,
    "cispo": True,
    "reinforce_plus_plus_baseline": False,
}


def normalize_group_rewards(
    rewards: torch.Tensor, n_samples_per_prompt: int, use_std: bool, eps: float = 1e-6
) -> torch.Tensor:
    """Subtract each group's mean reward and, with `use_std`, divide by (group std + eps).

    `rewards` is [B] with B a multiple of n_samples_per_prompt, consecutive samples forming a
    group; the std is torch's default (unbiased, n - 1). Returns a float32 tensor of shape [B].
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 1 or rewards.numel() % n_samples_per_prompt:
        raise ValueError(
            f"{tuple(rewards.shape)} rewards cannot be grouped by --n-samples-per-prompt "
            f"{n_samples_per_prompt}"
        )
    if use_std and n_samples_per_prompt < 2:
        raise ValueError(
            "group std normalisation needs --n-samples-per-prompt >= 2; "
            "pass --disable-grpo-std-normalization for single-sample groups"
        )
    groups = rewards.view(-1, n_samples_per_prompt)
    groups = groups - groups.mean(dim=-1, keepdim=True)
    if use_std:
        groups = groups / (groups.std(dim=-1, keepdim=True) + eps)
    return groups.flatten()


def post_process_rewards(
    raw_rewards: Sequence[float] | torch.Tensor,
    *,
    estimator: str,
    n_samples_per_prompt: int,
    rewards_normalization: bool = True,
    grpo_std_normalization: bool = True,
) -> torch.Tensor:
    """Rewards the estimator consumes, from raw per-sample rewards ([B] float32).

    grpo/gspo/cispo: group mean subtracted, divided by group std unless `grpo_std_normalization` is
    off; reinforce_plus_plus_baseline: group mean subtracted only; others: unchanged. With
    `rewards_normalization` off (--disable-rewards-normalization) the raw rewards pass through.
    """
    _check_estimator(estimator)
    rewards = torch.as_tensor(raw_rewards, dtype=torch.float32)
    if not rewards_normalization or estimator not in _GROUP_NORMALIZED:
        return rewards
    use_std = _GROUP_NORMALIZED[estimator] and grpo_std_normalization
    return normalize_group_rewards(rewards, n_samples_per_prompt, use_std)


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[sum(v*m), sum(v^2*m), sum(m)] in float64, shape [3]; all-reduce (SUM) it across ranks."""
    values, mask = values.double(), mask.double()
    return torch.stack([(values * mask).sum(), (values.pow(2) * mask).sum(), mask.sum()])


def whiten_from_moments(
    values: torch.Tensor, moments: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) with mean and var from `masked_moments` totals.

    The variance is unbiased (n / (n - 1)) when the count is at least 2. With `shift_mean` False
    the mean is added back (scale only). Returns a tensor shaped and typed like `values`.
    """
    total, total_sq, count = moments.double().unbind()
    if count <= 0:
        raise ValueError("cannot whiten advantages: no token has loss_mask == 1")
    mean = total / count
    var = total_sq / count - mean.pow(2)
    if count >= 2:
        var = var * count / (count - 1)
    whitened = (values.double() - mean) * torch.rsqrt(var.clamp_min(0) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened.to(values.dtype)


def normalize_advantages(
    advantages: list[torch.Tensor], loss_masks: list[torch.Tensor], eps: float = 1e-8
) -> list[torch.Tensor]:
    """Whiten advantages over all tokens with loss_mask == 1 (--normalize-advantages), per-sample
    list in, per-sample list out (same shapes). Masked-out tokens are transformed too but do not
    enter the statistics."""
    return _whiten_per_sample(advantages, loss_masks, eps)


def _whiten_per_sample(advantages, loss_masks, eps=1e-8):
    if not advantages:
        return []
    flat = torch.cat(advantages)
    whitened = whiten_from_moments(flat, masked_moments(flat, torch.cat(loss_masks)), eps=eps)
    return list(whitened.split([a.numel() for a in advantages]))


def _grpo(*, rewards, kl, **_unused):
    returns = ppo_utils.get_grpo_returns(rewards, kl)
    return list(returns), returns


def _reinforce_plus_plus(*, rewards, kl, loss_masks, response_lengths, total_lengths, kl_coef, gamma,
                         **_unused):
    returns = ppo_utils.get_reinforce_plus_plus_returns(
        rewards, kl, loss_masks, response_lengths, total_lengths, kl_coef, gamma
    )
    return list(returns), returns


def _reinforce_plus_plus_baseline(*, rewards, kl, loss_masks, kl_coef, **_unused):
    advantages = ppo_utils.get_reinforce_plus_plus_baseline_advantages(rewards, kl, loss_masks, kl_coef)
    return advantages, list(advantages)


def _ppo(*, rewards, kl, values, response_lengths, total_lengths, kl_coef, gamma, lambd, **_unused):
    if values is None:
        raise ValueError("--advantage-estimator ppo needs critic values (none were given)")
    advantages, returns = [], []
    for i, k in enumerate(kl):
        # Token reward: -kl_coef * kl, with the sample reward added on the last response token.
        token_rewards = -kl_coef * k.float()
        token_rewards[-1] += rewards[i]
        adv, ret = ppo_utils.get_advantages_and_returns(
            total_lengths[i], response_lengths[i], values[i], token_rewards, gamma, lambd
        )
        advantages.append(adv)
        returns.append(ret)
    return advantages, returns


ADVANTAGE_ESTIMATORS: dict[str, Callable] = {
    "grpo": _grpo,
    "gspo": _grpo,
    "cispo": _grpo,
    "reinforce_plus_plus": _reinforce_plus_plus,
    "reinforce_plus_plus_baseline": _reinforce_plus_plus_baseline,
    "ppo": _ppo,
}


def _check_estimator(estimator: str) -> None:
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"--advantage-estimator {estimator!r} is unknown; choices: {sorted(ADVANTAGE_ESTIMATORS)}"
        )


def _per_token_kl(log_probs, ref_log_probs, loss_masks, kl_coef, kl_loss_type):
    if kl_coef == 0 or log_probs is None or ref_log_probs is None:
        return [torch.zeros(m.shape, dtype=torch.float32, device=m.device) for m in loss_masks]
    return [ppo_utils.compute_approx_kl(lp, ref, kl_loss_type) for lp, ref in zip(log_probs, ref_log_probs)]


def compute_advantages_and_returns(
    estimator: str,
    *,
    rewards: Sequence[float] | torch.Tensor,
    loss_masks: list[torch.Tensor],
    response_lengths: list[int],
    total_lengths: list[int],
    log_probs: list[torch.Tensor] | None = None,
    ref_log_probs: list[torch.Tensor] | None = None,
    values: list[torch.Tensor] | None = None,
    kl_coef: float = 0.0,
    kl_loss_type: str = "k1",
    gamma: float = 1.0,
    lambd: float = 1.0,
    normalize_advantages: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-sample advantages and returns for one batch, each a [response_len_i] tensor.

    `rewards` are the post-processed per-sample rewards ([B], see `post_process_rewards`).
    The per-token KL penalty (`kl_coef` * compute_approx_kl(log_probs, ref_log_probs,
    kl_loss_type)) is used by reinforce_plus_plus(_baseline) and ppo; it is zero when kl_coef is 0
    or either log-prob list is missing. `values` (critic, [response_len_i] each) are needed by ppo.
    With `normalize_advantages` the advantages are whitened over the masked tokens of this batch
    only; the trainer whitens over the data-parallel batch instead (masked_moments all-reduced,
    then whiten_from_moments).
    """
    _check_estimator(estimator)
    if not (len(loss_masks) == len(response_lengths) == len(total_lengths) == len(rewards)):
        raise ValueError(
            f"batch sizes disagree: {len(rewards)} rewards, {len(loss_masks)} loss masks, "
            f"{len(response_lengths)} response lengths, {len(total_lengths)} total lengths"
        )
    device = loss_masks[0].device if loss_masks else None
    rewards = torch.as_tensor(rewards, dtype=torch.float32, device=device)
    kl = _per_token_kl(log_probs, ref_log_probs, loss_masks, kl_coef, kl_loss_type)
    advantages, returns = ADVANTAGE_ESTIMATORS[estimator](
        rewards=rewards, kl=kl, values=values, loss_masks=loss_masks, response_lengths=response_lengths,
        total_lengths=total_lengths, kl_coef=kl_coef, gamma=gamma, lambd=lambd,
    )
    if normalize_advantages:
        advantages = _whiten_per_sample(advantages, loss_masks)
    return advantages, returns


def advantage_options_from_args(args) -> dict:
    """Keyword arguments of `compute_advantages_and_returns` read from parsed flags.

    Reads args.advantage_estimator, kl_coef, kl_loss_type, gamma, lambd, normalize_advantages.
    Returns a dict with `estimator` plus the keyword options; data tensors are the caller's.
    """
    return {
        "estimator": args.advantage_estimator,
        "kl_coef": args.kl_coef,
        "kl_loss_type": args.kl_loss_type,
        "gamma": args.gamma,
        "lambd": args.lambd,
        "normalize_advantages": args.normalize_advantages,
    }


# ---- on-policy distillation (--use-opd) -----------------------------------------------------------
def opd_reverse_kl(log_probs: list[torch.Tensor], teacher_log_probs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-token reverse KL estimate of on-policy distillation, student log-prob minus teacher
    log-prob of each sampled response token (the sample's own estimate of KL(student || teacher)).
    Per-sample lists of [response_len_i] tensors in and out (float32); lengths must agree."""
    if len(log_probs) != len(teacher_log_probs):
        raise ValueError(f"{len(log_probs)} samples of student log-probs but {len(teacher_log_probs)} of teacher "
                         "log-probs")
    out = []
    for i, (student, teacher) in enumerate(zip(log_probs, teacher_log_probs)):
        student, teacher = torch.as_tensor(student).float(), torch.as_tensor(teacher).float()
        if student.shape != teacher.shape:
            raise ValueError(f"sample {i}: student log-probs {tuple(student.shape)} and teacher log-probs "
                             f"{tuple(teacher.shape)} differ (the teacher must score every response token)")
        out.append(student - teacher.to(student.device))
    return out


def apply_opd_advantages(advantages: list[torch.Tensor], log_probs: list[torch.Tensor],
                         teacher_log_probs: list[torch.Tensor], kl_coef: float) -> list[torch.Tensor]:
    """Advantages with the distillation term: advantage - kl_coef * (student - teacher log-prob)
    per response token, i.e. the task advantage plus kl_coef times the teacher's log-prob gain
    over the student. Per-sample [response_len_i] tensors; returns new tensors (inputs untouched)."""
    if len(advantages) != len(log_probs):
        raise ValueError(f"{len(advantages)} samples of advantages but {len(log_probs)} of log-probs")
    kls = opd_reverse_kl(log_probs, teacher_log_probs)
    out = []
    for i, (adv, kl) in enumerate(zip(advantages, kls)):
        adv = torch.as_tensor(adv).float()
        if adv.shape != kl.shape:
            raise ValueError(f"sample {i}: advantages {tuple(adv.shape)} and log-probs {tuple(kl.shape)} differ")
        out.append(adv - kl_coef * kl.to(adv.device))
    return out


def masked_mean_kl(kls: list[torch.Tensor], loss_masks: list[torch.Tensor]) -> torch.Tensor:
    """[sum(kl * mask), sum(mask)] in float64 (all-reduce it, then divide): the token mean of the
    reverse KL over trainable tokens."""
    if not kls:
        return torch.zeros(2, dtype=torch.float64)
    kl, mask = torch.cat([k.double() for k in kls]), torch.cat([torch.as_tensor(m).double() for m in loss_masks])
    return torch.stack([(kl * mask).sum(), mask.sum()])
