"""CriticSide: a no-op without ppo; with it, values join the rollout, the actor sits out the
critic-only rollouts, and the actor's log-probs reach the critic only when the reward has a KL term."""

from types import SimpleNamespace

from slime.ray.critic import CriticSide


class Group:
    def __init__(self, answers):
        self.calls, self.answers = [], answers

    def run(self, method, *args):
        self.calls.append((method, *args))
        return dict(self.answers[method]) if isinstance(self.answers[method], dict) else self.answers[method]


def _side(kl_coef=0.0, critic_only=1):
    side = CriticSide.__new__(CriticSide)
    side.args = SimpleNamespace(num_critic_only_steps=critic_only, kl_coef=kl_coef, critic_save=None)
    side.group = Group({"compute_values": [[0.5]], "train": {"critic/value_loss": 1.0}})
    return side


def test_without_a_critic_every_call_is_a_no_op():
    side = CriticSide.__new__(CriticSide)
    side.args, side.group = SimpleNamespace(num_critic_only_steps=3, kl_coef=0.1), None
    data = {"tokens": [[1]]}
    assert side.add_values(data) is data and side.actor_trains(0) and side.train(0, data, None) == {}


def test_values_join_the_rollout_and_the_actor_waits():
    side = _side()
    data = side.add_values({"tokens": [[1, 2]]})
    assert data["values"] == [[0.5]]
    assert not side.actor_trains(0) and side.actor_trains(1)
    assert side.train(0, data, actor=None) == {"critic/value_loss": 1.0, "critic/actor_trained": 0.0}


def test_actor_log_probs_reach_the_critic_only_with_kl_coef():
    actor = SimpleNamespace(group=Group({"ppo_kl_inputs": {"log_probs": ["lp"], "ref_log_probs": ["ref"]}}))
    data = {"tokens": [[1, 2]], "values": [[0.5]]}
    _side(kl_coef=0.0).train(1, data, actor)
    assert actor.group.calls == []
    side = _side(kl_coef=0.1)
    side.train(0, data, actor)  # critic-only rollout: the actor did not compute log-probs
    assert actor.group.calls == []
    side.train(1, data, actor)
    assert actor.group.calls == [("ppo_kl_inputs", 1)]
    sent = side.group.calls[-1][2]
    assert sent["log_probs"] == ["lp"] and sent["ref_log_probs"] == ["ref"] and sent["values"] == [[0.5]]
