"""The critic side of a job (`--advantage-estimator ppo`): the value model's trainer group and its
place in each rollout. Without ppo every method is a no-op, so the loops call it unconditionally.

Per rollout (`train.py`): `add_values` (critic forward: values of every sample, added to the
rollout as `values`), the actor trains on them unless `actor_trains` says the rollout is one of the
first `--num-critic-only-steps`, then `train` (the critic's value-loss steps; with `--kl-coef` the
actor's log-probs of that rollout first, for the reward's KL penalty). slime runs the critic's
training alongside the actor's; here it follows it (the returns need the actor's log-probs).
"""

from __future__ import annotations

import logging

from slime.ray.actor_group import RayTrainGroup

logger = logging.getLogger(__name__)


class CriticSide:
    """The critic's trainer ranks on `plan.critic_bundles` (none without ppo)."""

    def __init__(self, args, placement):
        job_placement, plan = placement
        self.args = args
        self.group = RayTrainGroup(args, job_placement, plan.critic_bundles, role="critic") \
            if plan.critic_bundles else None

    def init(self) -> None:
        """Build every critic rank and load its weights (`--critic-load`, else `--ref-load`)."""
        if self.group is not None:
            self.group.init()

    def actor_trains(self, rollout_id: int) -> bool:
        """False for the first `--num-critic-only-steps` rollouts of a ppo run."""
        return self.group is None or rollout_id >= self.args.num_critic_only_steps

    def add_values(self, data: dict) -> dict:
        """`data` plus `values` (per sample, per response token) from the critic."""
        if self.group is None:
            return data
        return {**data, "values": self.group.run("compute_values", data)}

    def train(self, rollout_id: int, data: dict, actor) -> dict:
        """The critic's steps on `data` (with its `values`); returns `critic/` metrics. `actor`
        (an ActorSide) shares the rollout's log-probs when the reward has a KL penalty."""
        if self.group is None:
            return {}
        if self.args.kl_coef != 0 and self.actor_trains(rollout_id) and actor.group is not None:
            data = {**data, **actor.group.run("ppo_kl_inputs", len(data["tokens"]))}
        metrics = self.group.run("train", rollout_id, data)
        metrics["critic/actor_trained"] = float(self.actor_trains(rollout_id))
        return metrics

    def save(self, rollout_id: int) -> dict:
        if self.group is not None and self.args.critic_save:
            self.group.save(rollout_id)
        return {}

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.shutdown()
