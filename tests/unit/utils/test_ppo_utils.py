"""Hand-computed checks of the per-token RL math in slime.utils.ppo_utils."""

import math

import pytest
import torch

from slime.utils import ppo_utils


def _t(*values):
    return torch.tensor(values, dtype=torch.float32)


def _close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# r = log_probs - log_probs_base = [0, 0.5, -1]
LOG_PROBS = _t(-1.0, -0.5, -2.0)
BASE = _t(-1.0, -1.0, -1.0)


def test_kl_k1_is_log_ratio():
    _close(ppo_utils.compute_approx_kl(LOG_PROBS, BASE, "k1"), [0.0, 0.5, -1.0])


def test_kl_k2_is_half_squared_log_ratio():
    # r^2 / 2 = [0, 0.25/2, 1/2]
    _close(ppo_utils.compute_approx_kl(LOG_PROBS, BASE, "k2"), [0.0, 0.125, 0.5])


@pytest.mark.parametrize("kind", ["k3", "low_var_kl"])
def test_kl_k3_and_low_var_kl(kind):
    # exp(-r) - 1 + r: r=0 -> 0; r=0.5 -> 0.60653066 - 0.5 = 0.10653066; r=-1 -> e - 1 - 1 = 0.71828183
    _close(ppo_utils.compute_approx_kl(LOG_PROBS, BASE, kind), [0.0, 0.10653066, 0.71828183])


def test_low_var_kl_is_clamped_but_k3_is_not():
    # r = -5: exp(5) - 1 - 5 = 148.4131591 - 6 = 142.4131591; low_var_kl clamps to 10
    lp, base = _t(-6.0), _t(-1.0)
    _close(ppo_utils.compute_approx_kl(lp, base, "k3"), [142.4131591], atol=1e-4)
    _close(ppo_utils.compute_approx_kl(lp, base, "low_var_kl"), [10.0])


def test_kl_importance_ratio_multiplies():
    # k1 = [0, 0.5, -1] times [1, 2, 0.5] = [0, 1, -0.5]
    out = ppo_utils.compute_approx_kl(LOG_PROBS, BASE, "k1", importance_ratio=_t(1.0, 2.0, 0.5))
    _close(out, [0.0, 1.0, -0.5])


def test_kl_unknown_type_names_flag():
    with pytest.raises(ValueError, match="--kl-loss-type"):
        ppo_utils.compute_approx_kl(LOG_PROBS, BASE, "k4")


def _ppo_kl_for(ratios):
    # ppo_kl = old - new = -log(ratio)
    return -torch.log(_t(*ratios))


# eps_clip 0.2, eps_clip_high 0.28: ratio window [0.8, 1.28]
#   A=+1, ratio 1.1: max(-1.1, -1.1) = -1.1, not clipped
#   A=+1, ratio 1.5: max(-1.5, -1.28) = -1.28, clipped
#   A=-1, ratio 0.5: max(0.5, 0.8) = 0.8, clipped
#   A=-1, ratio 5.0: max(5.0, 1.28) = 5.0, not clipped (dual clip caps it at 3 when eps_clip_c=3)
#   A=+1, ratio 0.5: max(-0.5, -0.8) = -0.5, not clipped
#   A=+1, ratio 5.0: max(-5.0, -1.28) = -1.28, clipped (dual clip never touches A > 0)
RATIOS = (1.1, 1.5, 0.5, 5.0, 0.5, 5.0)
ADVS = _t(1.0, 1.0, -1.0, -1.0, 1.0, 1.0)


def test_policy_loss_clip_cases():
    loss, clipfrac = ppo_utils.compute_policy_loss(_ppo_kl_for(RATIOS), ADVS, 0.2, 0.28)
    _close(loss, [-1.1, -1.28, 0.8, 5.0, -0.5, -1.28], atol=1e-5)
    _close(clipfrac, [0.0, 1.0, 1.0, 0.0, 0.0, 1.0])


def test_policy_loss_dual_clip_caps_negative_advantage():
    loss, clipfrac = ppo_utils.compute_policy_loss(_ppo_kl_for(RATIOS), ADVS, 0.2, 0.28, eps_clip_c=3.0)
    # only the A=-1, ratio=5 token changes: min(5, -(-1) * 3) = 3
    _close(loss, [-1.1, -1.28, 0.8, 3.0, -0.5, -1.28], atol=1e-5)
    _close(clipfrac, [0.0, 1.0, 1.0, 0.0, 0.0, 1.0])


def test_policy_loss_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="--eps-clip-c"):
        ppo_utils.compute_policy_loss(_ppo_kl_for(RATIOS), ADVS, 0.2, 0.28, eps_clip_c=1.0)


@pytest.mark.parametrize("advantage,sign", [(1.0, 1.0), (-1.0, -1.0)])
def test_policy_loss_gradient_moves_log_prob_with_advantage(advantage, sign):
    old = _t(-1.0)
    log_probs = _t(-1.0).requires_grad_()
    loss, _ = ppo_utils.compute_policy_loss(old - log_probs, _t(advantage), 0.2, 0.2)
    loss.sum().backward()
    # d(-A * exp(logp - old))/dlogp = -A at ratio 1: descent raises logp iff A > 0
    _close(log_probs.grad, [-advantage])
    stepped = log_probs.detach() - 0.1 * log_probs.grad
    assert sign * (stepped - log_probs.detach()).item() > 0


def test_value_loss_clipping():
    # delta = [0.5, 1.5, 0.1], clip 0.2 -> V_clip = [0.7, 0.7, 0.6]
    # token0: max((0.7-1)^2, (1-1)^2) = 0.09; token1: max(0.49, 4) = 4; token2: max(0.36, 0.36)
    loss, clipfrac = ppo_utils.compute_value_loss(_t(1.0, 2.0, 0.6), _t(0.5, 0.5, 0.5), _t(1.0, 0.0, 0.0), 0.2)
    _close(loss, [0.09, 4.0, 0.36], atol=1e-5)
    _close(clipfrac, [1.0, 1.0, 0.0])


def test_entropy_of_uniform_is_log_vocab():
    _close(ppo_utils.compute_entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))


def test_entropy_two_class_by_hand():
    # p = [0.25, 0.75]: -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.34657359 + 0.21576155 = 0.56233514
    _close(ppo_utils.compute_entropy_from_logits(_t(0.0, math.log(3.0))), 0.56233514)


def test_log_probs_match_manual_gather():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 11, generator=gen)
    tokens = torch.tensor([0, 3, 10, 7, 3])
    expected = torch.stack([logits[i].softmax(-1)[tokens[i]].log() for i in range(5)])
    _close(ppo_utils.compute_log_probs(logits, tokens), expected, atol=1e-5)
    # p(token 1) under logits [0, ln 3] is 0.75; bf16 logits give an fp32 result
    out = ppo_utils.compute_log_probs(_t(0.0, math.log(3.0)).unsqueeze(0).bfloat16(), torch.tensor([1]))
    assert out.dtype == torch.float32
    _close(out, [math.log(0.75)], atol=1e-2)


def test_log_probs_shape_mismatch_raises():
    with pytest.raises(ValueError, match="do not match"):
        ppo_utils.compute_log_probs(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))


def test_grpo_returns_broadcast_reward():
    out = ppo_utils.get_grpo_returns(_t(1.0, -0.5), [torch.zeros(3), torch.zeros(2)])
    _close(out[0], [1.0, 1.0, 1.0])
    _close(out[1], [-0.5, -0.5])


def test_reinforce_plus_plus_returns_gamma_half():
    # masked kl = [0.1, 0.2, 0.3, 0]; token rewards = -0.5 * kl = [-0.05, -0.1, -0.15, 0]
    # reward 1 on the last masked token (index 2): [-0.05, -0.1, 0.85, 0]
    # G3 = 0; G2 = 0.85; G1 = -0.1 + 0.5 * 0.85 = 0.325; G0 = -0.05 + 0.5 * 0.325 = 0.1125
    # the second sample is fully masked: no reward, zero returns
    kl = [_t(0.1, 0.2, 0.3, 0.4), _t(0.7, 0.9)]
    masks = [_t(1, 1, 1, 0), _t(0, 0)]
    out = ppo_utils.get_reinforce_plus_plus_returns(_t(1.0, 5.0), kl, masks, [4, 2], [10, 6], 0.5, 0.5)
    _close(out[0], [0.1125, 0.325, 0.85, 0.0])
    _close(out[1], [0.0, 0.0])


def test_reinforce_plus_plus_returns_checks_lengths():
    with pytest.raises(ValueError, match="response_length 3"):
        ppo_utils.get_reinforce_plus_plus_returns(_t(1.0), [_t(0.0, 0.0)], [_t(1, 1)], [3], [5], 0.1, 1.0)


def test_reinforce_plus_plus_baseline_advantages():
    # 0.5 - 0.5 * [0.2, 0.4] = [0.4, 0.3]
    out = ppo_utils.get_reinforce_plus_plus_baseline_advantages(_t(0.5), [_t(0.2, 0.4)], [_t(1, 1)], 0.5)
    _close(out[0], [0.4, 0.3])
    # as in slime the KL is not masked: a masked token still gets 0.5 - 0.5 * 0.4
    out = ppo_utils.get_reinforce_plus_plus_baseline_advantages(_t(0.5), [_t(0.2, 0.4)], [_t(1, 0)], 0.5)
    _close(out[0], [0.4, 0.3])


def test_gae_three_steps():
    # gamma 0.9, lambda 0.8, rewards [0, 0, 1], values [0.5, 0.6, 0.7]
    # deltas: t2 = 1 - 0.7 = 0.3; t1 = 0.9*0.7 - 0.6 = 0.03; t0 = 0.9*0.6 - 0.5 = 0.04
    # A2 = 0.3; A1 = 0.03 + 0.72*0.3 = 0.246; A0 = 0.04 + 0.72*0.246 = 0.21712
    values = _t(0.5, 0.6, 0.7)
    adv, ret = ppo_utils.get_advantages_and_returns(8, 3, values, _t(0.0, 0.0, 1.0), 0.9, 0.8)
    _close(adv, [0.21712, 0.246, 0.3], atol=1e-5)
    _close(ret, [0.71712, 0.846, 1.0], atol=1e-5)


def test_gae_with_unit_gamma_lambda_is_monte_carlo():
    adv, ret = ppo_utils.get_advantages_and_returns(3, 3, _t(0.5, 0.6, 0.7), _t(0.0, 0.0, 1.0), 1.0, 1.0)
    _close(ret, [1.0, 1.0, 1.0])
    _close(adv, [0.5, 0.4, 0.3])


def test_sequence_level_ppo_kl_mean_and_gradient():
    # sample 0: ppo_kl [0.1, 0.3, 0.5], mask [1, 1, 0] -> mean (0.1 + 0.3) / 2 = 0.2 on every token
    old = [_t(0.1, 0.3, 0.5), _t(-0.4)]
    new = [torch.zeros(3, requires_grad=True), torch.zeros(1, requires_grad=True)]
    masks = [_t(1, 1, 0), _t(1)]
    seq = ppo_utils.compute_sequence_level_ppo_kl([o - n for o, n in zip(old, new)], masks)
    _close(seq[0], [0.2, 0.2, 0.2])
    _close(seq[1], [-0.4])
    seq[0].sum().backward()
    # sum over 3 tokens of (old0 - new0 + old1 - new1) / 2 -> d/dnew = [-1.5, -1.5, 0]
    _close(new[0].grad, [-1.5, -1.5, 0.0])


def test_gspo_kl_flattens_and_broadcasts_to_local_tokens():
    full_new = [torch.zeros(3), torch.zeros(1)]
    full_old = [_t(0.1, 0.3, 0.5), _t(-0.4)]
    local = [torch.zeros(2), torch.zeros(1)]  # this rank holds 2 of sample 0's 3 tokens
    out = ppo_utils.compute_gspo_kl(full_new, full_old, local, [_t(1, 1, 0), _t(1)])
    _close(out, [0.2, 0.2, -0.4])


def test_cispo_gradient_flows_only_through_log_prob():
    # slime's signature compute_cispo_loss(ppo_kl, log_probs, advantages, eps_clip, eps_clip_high).
    # ppo_kl = old - new = [0, -1, 1] -> ratio [1, e, 1/e]; weight = clip(ratio, 0.8, 1.28)
    # = [1, 1.28, 0.8], detached. loss = -w * A * logp = [1, 5.12, 1.6]; grad = -w * A
    # (without the stop-gradient token 0 would get -A * (ratio * logp + ratio) = 0)
    log_probs = _t(-1.0, -2.0, -2.0).requires_grad_()
    advantages = _t(1.0, 2.0, 1.0)
    loss, clipfrac = ppo_utils.compute_cispo_loss(_t(-1.0, -3.0, -1.0) - log_probs, log_probs, advantages, 0.2, 0.28)
    _close(loss, [1.0, 5.12, 1.6], atol=1e-5)
    _close(clipfrac, [0.0, 1.0, 1.0])
    loss.sum().backward()
    _close(log_probs.grad, [-1.0, -2.56, -0.8], atol=1e-5)


def test_tis_weights_truncate_and_detach():
    # raw = exp(train - rollout) = [1, 3, 0.25, 1.5]
    train = torch.zeros(4, requires_grad=True)
    rollout = torch.log(_t(1.0, 1 / 3, 4.0, 2 / 3))
    weights, clipfrac = ppo_utils.compute_tis_weights(train, rollout, tis_clip=2.0)
    _close(weights, [1.0, 2.0, 0.25, 1.5], atol=1e-5)
    _close(clipfrac, [0.0, 1.0, 0.0, 0.0])
    assert not weights.requires_grad
    weights, clipfrac = ppo_utils.compute_tis_weights(train, rollout, tis_clip=2.0, tis_clip_low=0.5)
    _close(weights, [1.0, 2.0, 0.5, 1.5], atol=1e-5)
    _close(clipfrac, [0.0, 1.0, 1.0, 0.0])


def test_tis_low_above_high_raises():
    with pytest.raises(ValueError, match="--tis-clip-low"):
        ppo_utils.compute_tis_weights(_t(0.0), _t(0.0), tis_clip=1.0, tis_clip_low=2.0)


def test_chunked_discounted_returns_matches_the_recursion():
    rewards = torch.tensor([[1.0, 0.0, 2.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0, 3.0]])
    expected = torch.zeros_like(rewards)
    running = torch.zeros(2)
    for t in reversed(range(5)):
        running = rewards[:, t] + 0.9 * running
        expected[:, t] = running
    for chunk in (1, 2, 3, 128):
        _close(ppo_utils.chunked_discounted_returns(rewards, 0.9, chunk_size=chunk), expected.tolist(), atol=1e-5)


def test_get_advantages_and_returns_batch_is_per_sample_gae():
    values = [_t(0.5, 0.2), _t(0.1)]
    rewards = [_t(0.0, 1.0), _t(2.0)]
    adv, ret = ppo_utils.get_advantages_and_returns_batch([4, 3], [2, 1], values, rewards, 1.0, 1.0)
    one_adv, one_ret = ppo_utils.get_advantages_and_returns(4, 2, values[0], rewards[0], 1.0, 1.0)
    _close(adv[0], one_adv.tolist())
    _close(ret[1], [2.0])


def test_vanilla_and_chunked_gae_match_per_sample_gae_on_a_padded_batch():
    lengths, gamma, lambd = [5, 3], 0.9, 0.8
    values = [torch.tensor([0.5, -1.0, 2.0, 0.25, 1.5]), torch.tensor([1.0, 0.0, -0.5])]
    rewards = [torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0]), torch.tensor([0.0, 0.5, -1.0])]
    pad = lambda rows: torch.stack([torch.nn.functional.pad(r, (0, 5 - len(r))) for r in rows])  # noqa: E731
    for adv, ret in (ppo_utils.vanilla_gae(pad(rewards), pad(values), gamma, lambd),
                     ppo_utils.chunked_gae(pad(rewards), pad(values), gamma, lambd, chunk_size=2)):
        for i, n in enumerate(lengths):
            want_adv, want_ret = ppo_utils.get_advantages_and_returns(n + 2, n, values[i], rewards[i], gamma, lambd)
            _close(adv[i, :n], want_adv.tolist(), atol=1e-5)
            _close(ret[i, :n], want_ret.tolist(), atol=1e-5)
    # by hand, one token: A = r - V; two tokens: A_0 = r_0 + g V_1 - V_0 + g l (r_1 - V_1)
    adv, ret = ppo_utils.vanilla_gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), gamma, lambd)
    _close(adv[0], [0.0 + 0.9 * 0.25 - 0.5 + 0.72 * 0.75, 0.75], atol=1e-6)
    with pytest.raises(ValueError, match="one \\[batch, T\\] shape"):
        ppo_utils.chunked_gae(torch.zeros(2, 3), torch.zeros(2, 4), gamma, lambd)


def test_compute_opsm_mask_drops_negative_advantages_of_far_off_policy_samples():
    from types import SimpleNamespace

    new = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0, -1.0])]
    # sample 0: mean masked KL (old - new) = (0.5 + 0.1) / 2 = 0.3; sample 1 (last token masked) = 0.05
    old = [torch.tensor([-0.5, -0.9]), torch.tensor([-0.95, -0.95, 5.0])]
    masks = [torch.ones(2), torch.tensor([1.0, 1.0, 0.0])]
    adv = torch.tensor([-1.0, 2.0, -1.0, -1.0, 3.0])
    mask, frac = ppo_utils.compute_opsm_mask(SimpleNamespace(opsm_delta=0.2), new, old, adv, masks)
    _close(mask, [0.0, 1.0, 1.0, 1.0, 1.0])  # only sample 0 is over 0.2, and only its negative token goes
    _close(frac, 0.5)
    mask, frac = ppo_utils.compute_opsm_mask(SimpleNamespace(opsm_delta=0.01), new, old, adv, masks)
    _close(mask, [0.0, 1.0, 0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="opsm_delta"):
        ppo_utils.compute_opsm_mask(SimpleNamespace(), new, old, adv, masks)
