"""Hand-computed checks of reward normalisation, estimators and whitening in slime.utils.advantages."""

import math

import pytest
import torch

from slime.utils import advantages as adv


def _t(*values):
    return torch.tensor(values, dtype=torch.float32)


def _close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# group 0: [1, 0, 0, 1] -> mean 0.5 -> [0.5, -0.5, -0.5, 0.5]; unbiased var = 4 * 0.25 / 3 = 1/3,
#          std = 0.57735027 -> 0.5 / (0.57735027 + 1e-6) = 0.86602390
# group 1: [2, 4, 6, 8] -> mean 5 -> [-3, -1, 1, 3]; var = (9 + 1 + 1 + 9) / 3 = 20/3,
#          std = 2.58198890 -> 3 / 2.58198990 = 1.16189457, 1 / 2.58198990 = 0.38729819
RAW = _t(1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0)
WITH_STD = [0.8660239, -0.8660239, -0.8660239, 0.8660239, -1.1618946, -0.3872982, 0.3872982, 1.1618946]
MEAN_ONLY = [0.5, -0.5, -0.5, 0.5, -3.0, -1.0, 1.0, 3.0]


def test_group_normalisation_with_std():
    _close(adv.normalize_group_rewards(RAW, 4, use_std=True), WITH_STD)


def test_group_normalisation_without_std():
    _close(adv.normalize_group_rewards(RAW, 4, use_std=False), MEAN_ONLY)


def test_group_normalisation_rejects_bad_shapes():
    with pytest.raises(ValueError, match="--n-samples-per-prompt"):
        adv.normalize_group_rewards(RAW, 3, use_std=True)
    with pytest.raises(ValueError, match="--disable-grpo-std-normalization"):
        adv.normalize_group_rewards(RAW, 1, use_std=True)


@pytest.mark.parametrize(
    "estimator,kwargs,expected",
    [
        ("grpo", {}, WITH_STD),
        ("gspo", {}, WITH_STD),
        ("cispo", {}, WITH_STD),
        ("grpo", {"grpo_std_normalization": False}, MEAN_ONLY),
        ("reinforce_plus_plus_baseline", {}, MEAN_ONLY),
        ("reinforce_plus_plus", {}, RAW.tolist()),
        ("ppo", {}, RAW.tolist()),
        ("grpo", {"rewards_normalization": False}, RAW.tolist()),
    ],
)
def test_post_process_rewards_per_estimator(estimator, kwargs, expected):
    out = adv.post_process_rewards(RAW.tolist(), estimator=estimator, n_samples_per_prompt=4, **kwargs)
    _close(out, expected)


def test_masked_whitening_by_hand():
    # masked tokens 1, 2, 3: mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> (x - 2) / 1; 100 is masked
    advs = [_t(1.0, 2.0), _t(3.0, 100.0)]
    masks = [_t(1, 1), _t(1, 0)]
    _close(adv.masked_moments(torch.cat(advs), torch.cat(masks)), [6.0, 14.0, 3.0])
    out = adv.normalize_advantages(advs, masks)
    _close(out[0], [-1.0, 0.0])
    _close(out[1], [1.0, 98.0])


def test_whitening_from_summed_moments_matches_whole_batch():
    # two "ranks" each contribute moments; their sum whitens exactly like the whole batch
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(10, generator=gen)
    mask = (torch.rand(10, generator=gen) > 0.3).float()
    moments = adv.masked_moments(values[:4], mask[:4]) + adv.masked_moments(values[4:], mask[4:])
    whole = adv.whiten_from_moments(values, adv.masked_moments(values, mask))
    _close(adv.whiten_from_moments(values, moments), whole)
    kept = whole[mask.bool()]
    _close(kept.mean(), 0.0)
    _close(kept.std(), 1.0, atol=1e-4)


def test_whitening_without_trained_tokens_raises():
    with pytest.raises(ValueError, match="loss_mask"):
        adv.normalize_advantages([_t(1.0)], [_t(0)])


def _batch(lengths):
    return {
        "loss_masks": [torch.ones(n) for n in lengths],
        "response_lengths": list(lengths),
        "total_lengths": [n + 4 for n in lengths],
    }


def test_grpo_broadcasts_reward_and_ignores_kl():
    log_probs = [torch.zeros(2), torch.zeros(3)]
    ref = [torch.full((2,), -1.0), torch.full((3,), -1.0)]
    advantages, returns = adv.compute_advantages_and_returns(
        "grpo", rewards=[1.0, -1.0], log_probs=log_probs, ref_log_probs=ref, kl_coef=0.5, **_batch([2, 3])
    )
    _close(advantages[0], [1.0, 1.0])
    _close(advantages[1], [-1.0, -1.0, -1.0])
    _close(returns[1], [-1.0, -1.0, -1.0])


def test_reinforce_plus_plus_uses_kl_penalty():
    # k1 kl = [-1 - (-1.5), 0] = [0.5, 0]; token rewards -0.2 * kl + reward on last = [-0.1, 1.0]
    # gamma 1: returns [0.9, 1.0]
    advantages, returns = adv.compute_advantages_and_returns(
        "reinforce_plus_plus", rewards=[1.0], log_probs=[_t(-1.0, -1.0)], ref_log_probs=[_t(-1.5, -1.0)],
        kl_coef=0.2, gamma=1.0, **_batch([2]),
    )
    _close(advantages[0], [0.9, 1.0])
    _close(returns[0], [0.9, 1.0])


def test_reinforce_plus_plus_baseline_subtracts_kl():
    # 0.5 - 0.2 * [0.5, 0] = [0.4, 0.5]
    advantages, _ = adv.compute_advantages_and_returns(
        "reinforce_plus_plus_baseline", rewards=[0.5], log_probs=[_t(-1.0, -1.0)],
        ref_log_probs=[_t(-1.5, -1.0)], kl_coef=0.2, **_batch([2]),
    )
    _close(advantages[0], [0.4, 0.5])


def test_ppo_gae_matches_hand_values():
    # same trajectory as the GAE test in test_ppo_utils: reward 1 on the last token, kl_coef 0
    advantages, returns = adv.compute_advantages_and_returns(
        "ppo", rewards=[1.0], values=[_t(0.5, 0.6, 0.7)], gamma=0.9, lambd=0.8, **_batch([3])
    )
    _close(advantages[0], [0.21712, 0.246, 0.3])
    _close(returns[0], [0.71712, 0.846, 1.0])


def test_ppo_token_rewards_include_kl():
    # kl = [0.5, 0]; token rewards [-0.1, 1.0]; values 0, gamma = lambda = 1 -> A = R = [0.9, 1.0]
    advantages, returns = adv.compute_advantages_and_returns(
        "ppo", rewards=[1.0], values=[torch.zeros(2)], log_probs=[_t(-1.0, -1.0)],
        ref_log_probs=[_t(-1.5, -1.0)], kl_coef=0.2, **_batch([2]),
    )
    _close(advantages[0], [0.9, 1.0])
    _close(returns[0], [0.9, 1.0])


def test_ppo_without_values_raises():
    with pytest.raises(ValueError, match="critic values"):
        adv.compute_advantages_and_returns("ppo", rewards=[1.0], **_batch([2]))


def test_normalize_advantages_flag_whitens():
    # advantages [1] and [-1]: mean 0, unbiased var (1 + 1) / 1 = 2 -> +-1/sqrt(2); returns untouched
    advantages, returns = adv.compute_advantages_and_returns(
        "grpo", rewards=[1.0, -1.0], normalize_advantages=True, **_batch([1, 1])
    )
    _close(torch.cat(advantages), [1 / math.sqrt(2), -1 / math.sqrt(2)])
    _close(torch.cat(returns), [1.0, -1.0])


def test_unknown_estimator_names_flag_and_choices():
    with pytest.raises(ValueError, match="--advantage-estimator 'vtrace'.*grpo"):
        adv.compute_advantages_and_returns("vtrace", rewards=[1.0], **_batch([1]))


def test_batch_size_mismatch_raises():
    with pytest.raises(ValueError, match="batch sizes disagree"):
        adv.compute_advantages_and_returns("grpo", rewards=[1.0, 2.0], **_batch([1]))


def test_registry_lists_slime_estimators():
    assert set(adv.ADVANTAGE_ESTIMATORS) == {
        "grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"
    }


def test_advantage_options_from_args():
    from types import SimpleNamespace

    args = SimpleNamespace(
        advantage_estimator="ppo", kl_coef=0.1, kl_loss_type="k3", gamma=0.9, lambd=0.8, normalize_advantages=True
    )
    opts = adv.advantage_options_from_args(args)
    assert opts == {
        "estimator": "ppo", "kl_coef": 0.1, "kl_loss_type": "k3", "gamma": 0.9, "lambd": 0.8,
        "normalize_advantages": True,
    }


# ---- on-policy distillation ------------------------------------------------------------------
# sample 0: student [-1.0, -2.0], teacher [-0.5, -3.0] -> reverse KL [-0.5, 1.0]
#           advantages [0.2, 0.2], coef 0.5 -> [0.2 + 0.25, 0.2 - 0.5] = [0.45, -0.3]
# sample 1: student [-0.1], teacher [-2.1] -> KL [2.0]; advantage [-1.0] -> -1.0 - 0.5 * 2 = [-2.0]
def test_opd_reverse_kl_is_student_minus_teacher():
    kl = adv.opd_reverse_kl([_t(-1.0, -2.0), _t(-0.1)], [_t(-0.5, -3.0), [-2.1]])
    _close(kl[0], [-0.5, 1.0])
    _close(kl[1], [2.0])


def test_opd_advantages_subtract_the_scaled_reverse_kl():
    advantages = [_t(0.2, 0.2), _t(-1.0)]
    out = adv.apply_opd_advantages(advantages, [_t(-1.0, -2.0), _t(-0.1)], [_t(-0.5, -3.0), _t(-2.1)], 0.5)
    _close(out[0], [0.45, -0.3])
    _close(out[1], [-2.0])
    _close(advantages[0], [0.2, 0.2])  # the inputs are left as they were


def test_opd_with_zero_coef_keeps_the_task_advantage():
    out = adv.apply_opd_advantages([_t(0.7, -0.3)], [_t(-1.0, -2.0)], [_t(-4.0, -0.1)], 0.0)
    _close(out[0], [0.7, -0.3])


def test_opd_masked_mean_kl_counts_trainable_tokens_only():
    # KL [-0.5, 1.0] mask [1, 0] and [2.0] mask [1] -> sum -0.5 + 2.0 = 1.5 over 2 tokens
    moments = adv.masked_mean_kl([_t(-0.5, 1.0), _t(2.0)], [_t(1, 0), _t(1)])
    _close(moments.float(), [1.5, 2.0])
    _close(adv.masked_mean_kl([], []).float(), [0.0, 0.0])


@pytest.mark.parametrize("student,teacher,match", [
    ([_t(-1.0, -2.0)], [_t(-1.0)], "sample 0: student log-probs"),
    ([_t(-1.0)], [_t(-1.0), _t(-1.0)], "1 samples of student log-probs but 2"),
])
def test_opd_misaligned_teacher_log_probs_raise(student, teacher, match):
    with pytest.raises(ValueError, match=match):
        adv.opd_reverse_kl(student, teacher)
