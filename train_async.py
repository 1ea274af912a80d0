"""One-step-off asynchronous RL training: rollout N+1 is generated while the trainer learns on
rollout N. Weights are synced every `--update-weights-interval` rollouts, after the generation in
flight has finished (so no rollout mixes two weight versions). Not for `--colocate`.
"""

import logging
import sys

from train import main as train_main


def train_async(args, early_ray=None) -> None:
    """Metrics rows as in train.py; eval runs on the weights just synced. `early_ray`: as train.py's."""
    from slime.ray.critic import CriticSide
    from slime.ray.job import ActorSide, JobScope, RolloutSide, Schedule

    with JobScope(args, early_ray) as job:  # on leaving, for any reason, everything the job started stops
        rollout = job.start(RolloutSide)  # the engines and the router start meanwhile
        if args.num_rollout is None:  # --num-epoch resolved before the actor builds its LR schedule (waits for
            args.num_rollout = rollout.num_rollout()  # the rollout manager: its data source knows the length)
        actor = job.start(ActorSide)  # the trainer ranks build while the engines start
        critic = job.start(CriticSide)  # --advantage-estimator ppo only (else every call is a no-op)
        rollout.keep_weights_from(actor)  # --use-fault-tolerance: restarted engines get the weights
        schedule = Schedule(args, start_rollout_id=actor.init(), num_rollout=args.num_rollout)
        critic.init()
        rollout.load(schedule.start_rollout_id)
        log = job.metrics_logger(total=schedule.num_rollout, start=schedule.start_rollout_id)
        actor.sync_weights(rollout, version=schedule.start_rollout_id)
        metrics = rollout.evaluate(schedule.start_rollout_id) if schedule.eval_before_training() else {}
        pending, ready = rollout.submit(schedule.start_rollout_id), None
        for rollout_id in schedule.rollouts():
            data, rollout_metrics = ready or rollout.collect(pending)
            metrics |= rollout_metrics
            log.begin(rollout_id, metrics)  # written on failure too, if the rollout does not finish
            pending = rollout.submit(rollout_id + 1) if rollout_id + 1 < schedule.num_rollout else None
            data = critic.add_values(data)
            if critic.actor_trains(rollout_id):  # not during --num-critic-only-steps
                metrics |= actor.train(rollout_id, data)
            metrics |= critic.train(rollout_id, data, actor)
            if schedule.save_after(rollout_id):
                metrics |= actor.save(rollout_id) | rollout.save(rollout_id) | critic.save(rollout_id)
            ready = None
            if (rollout_id + 1) % args.update_weights_interval == 0:
                ready = rollout.collect(pending) if pending else None  # let the in-flight rollout finish
                metrics |= actor.sync_weights(rollout, version=rollout_id + 1)
            log.log(rollout_id, metrics)
            metrics = rollout.evaluate(rollout_id + 1) if schedule.eval_after(rollout_id) else {}
        if metrics:
            log.log(schedule.num_rollout, metrics)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(train_main(entry="train_async", loop=train_async, early_ray=True))
