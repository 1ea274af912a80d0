"""Hand-computed checks of the micro-batch reductions and loss assembly in slime.utils.losses."""

import math
from types import SimpleNamespace

import pytest
import torch

from slime.utils import losses


def _t(*values):
    return torch.tensor(values, dtype=torch.float32)


def _close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# two samples of 2 and 4 tokens; the last token of sample 1 is masked out
X = _t(1.0, 3.0, 2.0, 4.0, 6.0, 8.0)
LENGTHS = [2, 4]
MASKS = [_t(1, 1), _t(1, 1, 1, 0)]


def test_sample_mean_and_token_sum_differ_by_hand():
    # sample means: (1 + 3) / 2 = 2 and (2 + 4 + 6) / 3 = 4 -> 6; token sum: 1 + 3 + 2 + 4 + 6 = 16
    _close(losses.sum_of_sample_mean(X, LENGTHS, MASKS), 6.0)
    _close(losses.sum_of_sample_mean(X, LENGTHS, MASKS, per_token=True), 16.0)


def test_reducer_accepts_flat_masks_and_fully_masked_samples():
    reduce = losses.get_sum_of_sample_mean([6, 9], LENGTHS, torch.cat(MASKS), calculate_per_token_loss=False)
    _close(reduce(X), 6.0)
    # a fully masked sample contributes 0 (its denominator is clamped to 1)
    _close(losses.sum_of_sample_mean(X, LENGTHS, [_t(1, 1), torch.zeros(4)]), 2.0)


def test_reducer_rejects_wrong_sizes():
    with pytest.raises(ValueError, match="response_length is 4"):
        losses.get_sum_of_sample_mean(None, LENGTHS, [_t(1, 1), _t(1, 1)])
    with pytest.raises(ValueError, match="total_length 3 < response_length 4"):
        losses.get_sum_of_sample_mean([2, 3], LENGTHS, MASKS)
    with pytest.raises(ValueError, match="expected 6"):
        losses.sum_of_sample_mean(X[:5], LENGTHS, MASKS)


# Policy batch: samples of 2 and 1 tokens; ratios [1.1, 1.5, 0.5], advantages [1, 1, -1], eps 0.2
# token losses: max(-1.1, -1.1) = -1.1; max(-1.5, -1.2) = -1.2 (clipped); max(0.5, 0.8) = 0.8 (clipped)
# pg_loss = (-1.1 - 1.2) / 2 + 0.8 = -0.35; pg_clipfrac = 0.5 + 1 = 1.5
# ppo_kl = -ln(ratio): (-0.0953102 - 0.4054651) / 2 + 0.6931472 = 0.4427596
OLD = _t(-1.0, -1.0, -1.0)
RATIOS = _t(1.1, 1.5, 0.5)
ADV = _t(1.0, 1.0, -1.0)
P_LENGTHS = [2, 1]
P_MASKS = [_t(1, 1), _t(1)]


def _policy(**overrides):
    kwargs = dict(
        log_probs=OLD + torch.log(RATIOS), old_log_probs=OLD, advantages=ADV, loss_masks=P_MASKS,
        response_lengths=P_LENGTHS, eps_clip=0.2,
    )
    kwargs.update(overrides)
    return losses.policy_loss(**kwargs)


def test_policy_loss_sample_mean_by_hand():
    loss, metrics = _policy()
    _close(loss, -0.35)
    _close(metrics["pg_loss"], -0.35)
    _close(metrics["pg_clipfrac"], 1.5)
    _close(metrics["ppo_kl"], 0.4427596)
    assert set(metrics) == {"pg_loss", "pg_clipfrac", "ppo_kl"}


def test_policy_loss_per_token_sum():
    loss, _ = _policy(per_token=True)
    _close(loss, -1.1 - 1.2 + 0.8)


def test_policy_loss_with_entropy_and_kl_terms():
    # entropy [1, 1, 2]: (1 + 1) / 2 + 2 = 3, times coef 0.1 subtracted -> -0.35 - 0.3
    # k1 kl = log_probs - ref = [0.5, 0, 0]: 0.5 / 2 + 0 = 0.25, times coef 0.4 added -> +0.1
    log_probs = OLD + torch.log(RATIOS)
    loss, metrics = _policy(
        entropy=_t(1.0, 1.0, 2.0), entropy_coef=0.1, use_kl_loss=True, kl_loss_coef=0.4,
        ref_log_probs=log_probs - _t(0.5, 0.0, 0.0),
    )
    _close(metrics["entropy_loss"], 3.0)
    _close(metrics["kl_loss"], 0.25)
    _close(loss, -0.35 - 0.3 + 0.1)


def test_policy_loss_kl_without_reference_raises():
    with pytest.raises(ValueError, match="--use-kl-loss"):
        _policy(use_kl_loss=True, kl_loss_coef=0.1)


def test_policy_loss_with_tis_by_hand():
    # rollout log probs give raw weights exp(old - rollout) = [3, 1, 0.25], clipped at 2 -> [2, 1, 0.25]
    # weighted token losses [-2.2, -1.2, 0.2] -> (-2.2 - 1.2) / 2 + 0.2 = -1.5
    # tis (raw) = (3 + 1) / 2 + 0.25 = 2.25; tis_clipfrac = 0.5 + 0 = 0.5
    # |old - rollout| = [ln 3, 0, ln 4]: ln 3 / 2 + ln 4 = 0.5493061 + 1.3862944 = 1.9356005
    rollout = OLD - torch.log(_t(3.0, 1.0, 0.25))
    loss, metrics = _policy(use_tis=True, tis_clip=2.0, rollout_log_probs=rollout)
    _close(loss, -1.5)
    _close(metrics["tis"], 2.25)
    _close(metrics["tis_clipfrac"], 0.5)
    _close(metrics["train_rollout_logprob_abs_diff"], 1.9356005)


def test_policy_loss_tis_needs_rollout_log_probs():
    with pytest.raises(ValueError, match="--use-tis"):
        _policy(use_tis=True)


def test_policy_loss_custom_tis_masks_drive_reduction():
    seen = {}

    def drop_second_token(*, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kw):
        seen["lengths"] = [t.numel() for t in train_log_probs]
        masks = [m.clone() for m in loss_masks]
        masks[0][1] = 0
        return pg_loss, masks, {"dropped": torch.ones_like(pg_loss)}

    # sample 0 keeps only token 0: -1.1 / 1 + 0.8 = -0.3
    loss, metrics = _policy(rollout_log_probs=OLD, use_tis=True, tis_function=drop_second_token)
    assert seen["lengths"] == [2, 1]
    _close(loss, -0.3)
    _close(metrics["dropped"], 2.0)


def test_gspo_uses_sequence_ratio():
    # one sample, token ratios [1.1, 1.5]: sequence ppo_kl = (-ln 1.1 - ln 1.5) / 2 = -0.2503876,
    # sequence ratio e^0.2503876 = 1.2845 > 1.2 -> every token -1.2, clipfrac 1 (token-level GRPO: -1.15)
    kwargs = dict(log_probs=OLD[:2] + torch.log(RATIOS[:2]), old_log_probs=OLD[:2], advantages=ADV[:2],
                  loss_masks=[_t(1, 1)], response_lengths=[2])
    loss, metrics = _policy(estimator="gspo", **kwargs)
    _close(loss, -1.2)
    _close(metrics["pg_clipfrac"], 1.0)
    _close(metrics["ppo_kl"], -0.2503876)
    grpo_loss, _ = _policy(estimator="grpo", **kwargs)
    _close(grpo_loss, -1.15)


def test_cispo_loss_by_hand():
    # weights min(ratio, 1.28) = [1.1, 1.28]; log_probs = -1 + ln ratio = [-0.9046898, -0.5945349]
    # token losses -w * A * logp = [0.9951588, 0.7610047]; mean 0.8780817; clipfrac (0 + 1) / 2
    log_probs = (OLD[:2] + torch.log(RATIOS[:2])).requires_grad_()
    loss, metrics = _policy(estimator="cispo", eps_clip_high=0.28, log_probs=log_probs, old_log_probs=OLD[:2],
                            advantages=ADV[:2], loss_masks=[_t(1, 1)], response_lengths=[2])
    _close(loss, 0.8780817)
    _close(metrics["pg_clipfrac"], 0.5)
    loss.backward()
    _close(log_probs.grad, [-1.1 / 2, -1.28 / 2])


def test_policy_loss_gradient_raises_positive_advantage_tokens():
    log_probs = OLD.clone().requires_grad_()
    loss, _ = _policy(log_probs=log_probs)
    loss.backward()
    # ratio 1 everywhere, inside the clip: d/dlogp = -A / len -> [-0.5, -0.5, +1]
    _close(log_probs.grad, [-0.5, -0.5, 1.0])


def test_unknown_estimator_for_policy_loss():
    with pytest.raises(ValueError, match="--advantage-estimator"):
        _policy(estimator="vtrace")


def test_value_loss_by_hand():
    # token losses [0.09, 4, 0.36] (see test_ppo_utils): mean 4.45 / 3 = 1.4833333; clipfrac 2/3
    loss, metrics = losses.value_loss(
        values=_t(1.0, 2.0, 0.6), old_values=_t(0.5, 0.5, 0.5), returns=_t(1.0, 0.0, 0.0),
        loss_masks=[_t(1, 1, 1)], response_lengths=[3], value_clip=0.2,
    )
    _close(loss, 1.4833333)
    _close(metrics["value_clipfrac"], 2 / 3)


def test_sft_loss_by_hand():
    # log probs [-1, -2 | -3]: sample mean 1.5 + 3 = 4.5; token sum 6
    kwargs = dict(log_probs=_t(-1.0, -2.0, -3.0), loss_masks=[_t(1, 1), _t(1)], response_lengths=[2, 1])
    loss, metrics = losses.sft_loss(**kwargs)
    _close(loss, 4.5)
    _close(metrics["loss"], 4.5)
    _close(losses.sft_loss(per_token=True, **kwargs)[0], 6.0)


def test_loss_registry_and_errors():
    assert losses.get_loss_function("sft_loss") is losses.sft_loss
    assert set(losses.LOSS_FUNCTIONS) == {"policy_loss", "value_loss", "sft_loss"}
    with pytest.raises(ValueError, match="--custom-loss-function-path"):
        losses.get_loss_function("custom_loss")
    with pytest.raises(ValueError, match="--loss-type 'dpo'"):
        losses.get_loss_function("dpo")


def test_policy_options_from_args_drive_policy_loss():
    args = SimpleNamespace(
        advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None, use_kl_loss=False,
        kl_loss_coef=0.0, kl_loss_type="k1", entropy_coef=0.0, use_tis=False, tis_clip=2.0, tis_clip_low=0.0,
        calculate_per_token_loss=True, value_clip=0.2,
    )
    opts = losses.loss_options_from_args("policy_loss", args)
    loss, _ = losses.policy_loss(
        log_probs=OLD + torch.log(RATIOS), old_log_probs=OLD, advantages=ADV, loss_masks=P_MASKS,
        response_lengths=P_LENGTHS, **opts,
    )
    _close(loss, -1.5)
    assert losses.loss_options_from_args("value_loss", args) == {"value_clip": 0.2, "per_token": True}
    assert math.isclose(opts["eps_clip_high"], 0.2)


def test_slime_cp_utils_reducer_argument_order_and_denominators():
    from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean as slime_reducer

    x, masks = _t(1.0, 3.0, 5.0), [_t(1, 1), _t(1)]
    _close(slime_reducer([3, 2], [2, 1], masks)(x), (1 + 3) / 2 + 5)
    _close(slime_reducer([3, 2], [2, 1], masks, [4.0, 5.0])(x), (1 + 3) / 4 + 5 / 5)
    _close(slime_reducer([3, 2], [2, 1], masks, None, True)(x), 9.0)
