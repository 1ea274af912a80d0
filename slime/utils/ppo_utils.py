"""Per-token RL math: KL estimators, clipped policy/value losses, returns and GAE, GSPO, CISPO, TIS.

Everything here is pure: tensors and explicit arguments in, tensors out, torch only, no process
groups. Names and signatures of `compute_approx_kl`, `compute_policy_loss` and `get_grpo_returns`
are part of slime's public surface (docs/slime-compat.md section 3) and stay as they are.

Conventions used throughout:
- `log_probs` are the current policy's per-token log probs, `old_log_probs` those of the policy
  that generated the data (recomputed by the trainer), `log_probs_base`/`ref_log_probs` the
  reference model's.
- `ppo_kl = old_log_probs - log_probs`, so the importance ratio pi/pi_old is `exp(-ppo_kl)`.
- Per-sample token tensors cover response tokens only; `loss_masks[i]` has the same length as the
  sample's response and is 1 where the token is trained on.
"""

from __future__ import annotations

import torch

# Clamp used by the low_var_kl estimator, as in slime (keeps a few wild tokens from dominating).
_LOW_VAR_KL_CLAMP = 10.0


def _kl_k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _kl_k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.pow(2) / 2.0


def _kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # With r = log p - log p_base: exp(-r) - 1 + r >= 0, an unbiased estimate of KL(p || p_base).
    return torch.exp(-log_ratio) - 1.0 + log_ratio


_KL_ESTIMATORS = {"k1": _kl_k1, "k2": _kl_k2, "k3": _kl_k3, "low_var_kl": _kl_k3}
KL_LOSS_TYPES = tuple(_KL_ESTIMATORS)


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_loss_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL(pi || pi_base) estimate, same shape as `log_probs`, in fp32.

    With r = log_probs - log_probs_base: k1 = r, k2 = r^2 / 2, k3 = low_var_kl = exp(-r) - 1 + r.
    `importance_ratio` (same shape) multiplies the estimate when given; low_var_kl is then clamped
    to [-10, 10].
    """
    if kl_loss_type not in _KL_ESTIMATORS:
        raise ValueError(f"--kl-loss-type must be one of {KL_LOSS_TYPES}, got {kl_loss_type!r}")
    log_ratio = log_probs.float() - log_probs_base.float()
    kl = _KL_ESTIMATORS[kl_loss_type](log_ratio)
    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kl_loss_type == "low_var_kl":
        kl = torch.clamp(kl, min=-_LOW_VAR_KL_CLAMP, max=_LOW_VAR_KL_CLAMP)
    return kl


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token, with optional dual clip.

    ratio = exp(-ppo_kl); loss = max(-A * ratio, -A * clip(ratio, 1 - eps_clip, 1 + eps_clip_high)).
    With `eps_clip_c` (> 1), tokens with A < 0 have their loss capped at -A * eps_clip_c (dual clip).
    Returns (pg_losses, clipfrac), both shaped like `ppo_kl`; clipfrac is 1.0 where the clipped
    branch of the max is the active one, else 0.0.
    """
    ratio = torch.exp(-ppo_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    clipped = torch.maximum(pg_losses1, pg_losses2)
    clipfrac = torch.gt(pg_losses2, pg_losses1).float()
    if eps_clip_c is None:
        return clipped, clipfrac
    if eps_clip_c <= 1.0:
        raise ValueError(f"--eps-clip-c must be > 1.0 for dual clip, got {eps_clip_c}")
    dual = torch.minimum(clipped, -advantages * eps_clip_c)
    return torch.where(advantages < 0, dual, clipped), clipfrac


def compute_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss per token: max((V_clip - R)^2, (V - R)^2).

    V_clip = old_values + clip(values - old_values, -value_clip, value_clip). Returns
    (loss, clipfrac) shaped like `values`; clipfrac is 1.0 where |values - old_values| > value_clip.
    """
    delta = values - old_values
    values_clipped = old_values + delta.clamp(-value_clip, value_clip)
    loss = torch.maximum((values_clipped - returns).pow(2), (values - returns).pow(2))
    return loss, (delta.abs() > value_clip).float()


def compute_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, in fp32: [..., V] -> [...]."""
    logits = logits.float()
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def compute_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log prob of each token under softmax(logits), in fp32: logits [..., V], tokens [...] -> [...]."""
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match tokens {tuple(tokens.shape)}")
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return log_p.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def get_grpo_returns(rewards: torch.Tensor, kl: list[torch.Tensor]) -> list[torch.Tensor]:
    """Broadcast each sample's scalar reward over its tokens: returns[i] = rewards[i] * ones_like(kl[i])."""
    return [torch.ones_like(kl[i]) * rewards[i] for i in range(len(kl))]


def _last_trained_index(loss_mask: torch.Tensor) -> int | None:
    nonzero = loss_mask.nonzero(as_tuple=True)[0]
    return int(nonzero[-1]) if nonzero.numel() else None


def _discounted_cumsum(token_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1}, backwards over a 1-D tensor; a constant (no gradient).

    The recursion runs on Python floats: one host sync per sample instead of one device op per
    token, which matters for responses of thousands of tokens.
    """
    returns = []
    running = 0.0
    for r in reversed(token_rewards.detach().double().tolist()):
        running = r + gamma * running
        returns.append(running)
    returns.reverse()
    return torch.tensor(returns, dtype=token_rewards.dtype, device=token_rewards.device)


def _check_lengths(i: int, token_tensor: torch.Tensor, mask: torch.Tensor, response_len: int, total_len: int):
    if token_tensor.numel() != response_len or mask.numel() != response_len:
        raise ValueError(
            f"sample {i}: response_length {response_len} but token tensor has {token_tensor.numel()} "
            f"and loss mask {mask.numel()} entries"
        )
    if total_len < response_len:
        raise ValueError(f"sample {i}: total_length {total_len} < response_length {response_len}")


def get_reinforce_plus_plus_returns(
    rewards: torch.Tensor,
    kl: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    response_lengths: list[int],
    total_lengths: list[int],
    kl_coef: float,
    gamma: float,
) -> list[torch.Tensor]:
    """REINFORCE++ per-token returns, one [response_len] tensor per sample.

    Token reward r_t = -kl_coef * kl_t * mask_t, plus the sample's scalar reward on the last token
    whose mask is 1; returns are the discounted cumulative sum of r backwards with `gamma`. A sample
    whose mask is all zero gets no scalar reward (it is not trained on). `total_lengths` (prompt +
    response) is checked against `response_lengths`.
    """
    out = []
    for i, (k, mask) in enumerate(zip(kl, loss_masks)):
        _check_lengths(i, k, mask, response_lengths[i], total_lengths[i])
        token_rewards = -kl_coef * (k.float() * mask.float())
        last = _last_trained_index(mask)
        if last is not None:
            token_rewards[last] += rewards[i]
        out.append(_discounted_cumsum(token_rewards, gamma))
    return out


def get_reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor,
    kl: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    kl_coef: float,
) -> list[torch.Tensor]:
    """REINFORCE++-baseline advantages: A_t = reward_i - kl_coef * kl_t per sample (as in slime the
    KL is not masked: masked tokens carry no loss, so their advantage is never used).

    `rewards` must already have the group mean subtracted (see advantages.normalize_group_rewards).
    `loss_masks` is accepted for slime's signature.
    """
    return [rewards[i] - kl_coef * kl[i].float() for i in range(len(kl))]


def get_advantages_and_returns(
    total_len: int,
    response_len: int,
    values: torch.Tensor,
    rewards: torch.Tensor,
    gamma: float,
    lambd: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over one trajectory of `response_len` tokens.

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last token is 0);
    A_t = delta_t + gamma * lambd * A_{t+1}; returns = A + V. `values` and `rewards` are
    [response_len]; returns (advantages detached, returns), both [response_len].
    """
    if values.numel() != response_len or rewards.numel() != response_len:
        raise ValueError(
            f"GAE needs {response_len} values and rewards, got {values.numel()} and {rewards.numel()}"
        )
    if total_len < response_len:
        raise ValueError(f"total_length {total_len} < response_length {response_len}")
    values = values.float()
    next_values = torch.cat([values[1:], values.new_zeros(1)])
    deltas = rewards.float() + gamma * next_values - values
    advantages = _discounted_cumsum(deltas, gamma * lambd)
    return advantages.detach(), advantages + values


def get_advantages_and_returns_batch(
    total_lengths: list[int],
    response_lengths: list[int],
    values_list: list[torch.Tensor],
    rewards_list: list[torch.Tensor],
    gamma: float,
    lambd: float,
    chunked: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """slime's batched GAE: `get_advantages_and_returns` per sample (no context parallelism here;
    `chunked` only selects slime's kernel there and gives the same numbers). Returns
    (advantages list, returns list), each tensor [response_len]."""
    pairs = [
        get_advantages_and_returns(t, r, v, rw, gamma, lambd)
        for t, r, v, rw in zip(total_lengths, response_lengths, values_list, rewards_list)
    ]
    return [a for a, _ in pairs], [r for _, r in pairs]


def _gae_deltas(rewards: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if rewards.shape != values.shape or rewards.dim() != 2:
        raise ValueError(f"GAE needs rewards and values of one [batch, T] shape, got {tuple(rewards.shape)} "
                         f"and {tuple(values.shape)}")
    values = values.float()
    next_values = torch.cat([values[:, 1:], values.new_zeros(values.shape[0], 1)], dim=1)
    return rewards.float() - values, next_values


def vanilla_gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """slime's padded-batch GAE: rewards, values [batch, T] (zeros past each response, so V after
    the last token is 0) -> (advantages, returns) [batch, T], token by token backwards; the numbers
    of `get_advantages_and_returns` on each unpadded row."""
    base, next_values = _gae_deltas(rewards, values)
    deltas = base + gamma * next_values
    advantages = torch.stack([_discounted_cumsum(row, gamma * lambd) for row in deltas]) if len(deltas) else deltas
    return advantages, advantages + values.float()


def chunked_gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float, chunk_size: int = 128
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`vanilla_gae` computed `chunk_size` tokens at a time (`chunked_discounted_returns` of the
    TD errors with discount gamma * lambd); the same numbers up to fp32 rounding."""
    base, next_values = _gae_deltas(rewards, values)
    advantages = chunked_discounted_returns(base + gamma * next_values, gamma * lambd, chunk_size)
    return advantages, advantages + values.float()


def chunked_discounted_returns(rewards: torch.Tensor, discount: float, chunk_size: int = 128) -> torch.Tensor:
    """G_t = r_t + discount * G_{t+1} along the last dim of `rewards` ([..., T]), in fp32.

    Computed backwards `chunk_size` steps at a time (a chunk is one matrix product with the
    discount powers), so long sequences do not need one op per token.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    rewards = rewards.float()
    steps = rewards.shape[-1]
    out = torch.empty_like(rewards)
    carry = torch.zeros(rewards.shape[:-1], dtype=rewards.dtype, device=rewards.device)
    for end in range(steps, 0, -chunk_size):
        start = max(0, end - chunk_size)
        n = end - start
        idx = torch.arange(n, device=rewards.device)
        # weights[i, j] = discount^(j - i) for j >= i: G_i = sum_j weights[i, j] r_j + discount^(n - i) carry
        power = (idx.unsqueeze(0) - idx.unsqueeze(1)).clamp(min=0).to(rewards.dtype)
        weights = torch.where(idx.unsqueeze(0) >= idx.unsqueeze(1), discount ** power, torch.zeros_like(power))
        tail = discount ** (n - idx).to(rewards.dtype)
        out[..., start:end] = rewards[..., start:end] @ weights.T + carry.unsqueeze(-1) * tail
        carry = out[..., start]
    return out


def compute_sequence_level_ppo_kl(
    ppo_kl: list[torch.Tensor], loss_masks: list[torch.Tensor]
) -> list[torch.Tensor]:
    """GSPO's sequence-level log ratio: per sample, the masked mean of `ppo_kl` over its response
    tokens, broadcast back to every token (gradient flows to all of them). One tensor per sample,
    shaped like ppo_kl[i]. exp(-result) is the sequence importance ratio (pi/pi_old)^(1/|y|).
    """
    out = []
    for kl, mask in zip(ppo_kl, loss_masks):
        mask = mask.to(kl.dtype)
        seq_kl = (kl * mask).sum() / torch.clamp_min(mask.sum(), 1)
        out.append(seq_kl.expand_as(kl))
    return out


def compute_gspo_kl(
    full_log_probs: list[torch.Tensor],
    full_old_log_probs: list[torch.Tensor],
    local_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> torch.Tensor:
    """Flat (concatenated) GSPO ppo_kl for this rank's tokens.

    The sequence mean is taken over each sample's full response (`full_*`, `loss_masks`) and
    broadcast to the tokens this rank holds (`local_log_probs[i]`, which differs from the full
    response only under context parallelism). Returns a 1-D tensor of sum(len(local_log_probs[i])).
    """
    per_sample = [old - new for new, old in zip(full_log_probs, full_old_log_probs)]
    seq_kl = compute_sequence_level_ppo_kl(per_sample, loss_masks)
    return torch.cat([kl[:1].expand_as(local) for kl, local in zip(seq_kl, local_log_probs)], dim=0)


def compute_opsm_mask(args, full_log_probs: list[torch.Tensor], full_old_log_probs: list[torch.Tensor],
                      advantages: torch.Tensor, loss_masks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Off-policy sequence masking (DeepSeek-V3.2's OPSM): a token is dropped (mask 0) when its
    advantage is negative and its sample's mean masked KL(old || current),
    sum(m * (old - new)) / max(sum(m), 1), exceeds `args.opsm_delta`.

    Per-sample whole-response tensors in, `advantages` flat [sum of response lengths]. Returns
    (flat 0/1 mask like `advantages`, scalar fraction of samples over the threshold)."""
    delta = getattr(args, "opsm_delta", None)
    if delta is None:
        raise ValueError("compute_opsm_mask needs args.opsm_delta (not a flag here: set it with --custom-config-path)")
    seq_kl = torch.stack([((old - new) * m).sum() / m.sum().clamp_min(1)
                          for new, old, m in zip(full_log_probs, full_old_log_probs, loss_masks, strict=True)])
    over = seq_kl > float(delta)
    per_token = torch.cat([flag.expand(len(m)) for flag, m in zip(over, loss_masks)]).to(advantages.device)
    if per_token.numel() != advantages.numel():
        raise ValueError(f"advantages has {advantages.numel()} tokens, the loss masks {per_token.numel()}")
    mask = (~(per_token & (advantages < 0))).to(advantages.dtype)
    return mask, over.float().mean()


def compute_cispo_loss(
    ppo_kl: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO per-token loss: -stopgrad(clip(ratio, 1 - eps_clip, 1 + eps_clip_high)) * A * log_probs.

    slime's signature and clipping. ratio = exp(-ppo_kl). The clipped importance weight carries no
    gradient, so the gradient flows only through `log_probs` (every token keeps a gradient, unlike
    PPO clipping). Returns (loss, clipfrac) with clipfrac 1.0 where the ratio was clipped.
    """
    ratio = torch.exp(-ppo_kl)
    clipped = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = -clipped.detach() * advantages * log_probs
    return loss, (clipped != ratio).float()


def compute_tis_weights(
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    tis_clip: float,
    tis_clip_low: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling weights for the rollout/trainer mismatch.

    w = exp(train_log_probs - rollout_log_probs) clamped to [tis_clip_low, tis_clip], detached.
    Returns (weights, clipfrac) shaped like the inputs; clipfrac is 1.0 where w was clamped.
    """
    if tis_clip_low > tis_clip:
        raise ValueError(f"--tis-clip-low ({tis_clip_low}) must not exceed --tis-clip ({tis_clip})")
    raw = torch.exp(train_log_probs.float() - rollout_log_probs.float()).detach()
    weights = raw.clamp(min=tis_clip_low, max=tis_clip)
    return weights, (weights != raw).float()
