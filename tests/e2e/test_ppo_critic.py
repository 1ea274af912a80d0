"""End to end, `--advantage-estimator ppo` (2 actor ranks + 2 critic ranks + 1 engine, EP=2):
the critic trains alone for `--num-critic-only-steps` rollouts, then the actor trains on GAE
advantages from its values; the value loss falls, and the
reward's KL penalty (--kl-coef) reaches the critic's returns through the actor's log-probs."""

import pytest

from tests.e2e.runner import grpo_argv, rollout_rows, run_train

pytestmark = pytest.mark.e2e

NUM_ROLLOUT = 4
CRITIC_ONLY = 1


def test_ppo_critic_trains_then_the_actor(e2e_inputs, tmp_path):
    extra = ["--advantage-estimator", "ppo", "--num-critic-only-steps", str(CRITIC_ONLY),
             "--critic-lr", "1e-4", "--kl-coef", "0.01", "--save-interval", "100",
             "--critic-save", str(tmp_path / "critic")]
    argv = grpo_argv(e2e_inputs.hf, e2e_inputs.torch_dist, e2e_inputs.data, tmp_path, NUM_ROLLOUT, extra=extra)
    by_id = rollout_rows(run_train(argv, tmp_path, timeout=600))
    assert sorted(by_id) == list(range(NUM_ROLLOUT))
    for i in range(NUM_ROLLOUT):
        row = by_id[i]
        assert row["critic/actor_trained"] == float(i >= CRITIC_ONLY), (i, row)
        assert ("train/pg_loss" in row) == (i >= CRITIC_ONLY), (i, row)
    losses = [by_id[i]["critic/value_loss"] for i in range(NUM_ROLLOUT)]
    assert min(losses[-2:]) < losses[0], losses
    # one-token responses, gamma = lambd = 1: a sample's return is its reward minus kl_coef x KL;
    # the KL (low_var_kl >= 0) is zero until the actor has moved away from the reference model
    for i in range(NUM_ROLLOUT):
        returns, reward = by_id[i]["critic/returns_mean"], by_id[i]["rollout/raw_reward"]
        if i <= CRITIC_ONLY:
            assert returns == pytest.approx(reward, abs=1e-6), (i, returns, reward)
        else:
            assert returns < reward - 1e-7, (i, returns, reward)
    assert (tmp_path / "critic" / "latest_checkpointed_iteration.txt").read_text().strip() == str(NUM_ROLLOUT - 1)
