"""Synchronous RL training: place -> rollout manager -> actor -> sync weights -> for each rollout:
generate, train, save, sync weights, eval.

`python train.py <flags> --dry-run` parses and validates every flag, builds megatron-core's config
objects as the GPU run would, prints the resolved plan (placement, parallel layout, batch
arithmetic, memory, the configs built), one `sglang command: ` line per engine
process (the exact launch line, hosts and ports as placeholders) and exits without starting Ray.
"""

import logging
import sys

from slime.utils.arguments import parse_args
from slime.utils.plan import build_plan, render_plan


def train(args) -> None:
    """Metrics row r holds rollout r and, when evaluated, the eval of the same weights that
    generated it (eval after rollout r-1); a final row holds the eval after the last rollout."""
    from slime.ray.critic import CriticSide
    from slime.ray.job import ActorSide, JobScope, RolloutSide, Schedule

    with JobScope(args) as job:  # on leaving, for any reason, everything the job started stops
        rollout = job.start(RolloutSide)
        args.num_rollout = rollout.num_rollout()  # --num-epoch resolved before the actor builds its LR schedule
        actor = job.start(ActorSide)
        critic = job.start(CriticSide)  # --advantage-estimator ppo only (else every call is a no-op)
        rollout.keep_weights_from(actor)  # --use-fault-tolerance: restarted engines get the weights
        schedule = Schedule(args, start_rollout_id=actor.init(rollout), num_rollout=args.num_rollout)
        critic.init()
        rollout.load(schedule.start_rollout_id)
        log = job.metrics_logger(total=schedule.num_rollout, start=schedule.start_rollout_id)
        actor.sync_weights(rollout, version=schedule.start_rollout_id)
        metrics = rollout.evaluate(schedule.start_rollout_id) if schedule.eval_before_training() else {}
        for rollout_id in schedule.rollouts():
            data, rollout_metrics = rollout.generate(rollout_id)
            metrics |= rollout_metrics
            metrics |= actor.onload_if_colocated(rollout)
            data = critic.add_values(data)
            if critic.actor_trains(rollout_id):  # not during --num-critic-only-steps
                metrics |= actor.train(rollout_id, data)
            metrics |= critic.train(rollout_id, data, actor)
            if schedule.save_after(rollout_id):
                metrics |= actor.save(rollout_id) | rollout.save(rollout_id) | critic.save(rollout_id)
            if schedule.sync_after(rollout_id):  # every --update-weights-interval rollouts
                metrics |= actor.sync_weights(rollout, version=rollout_id + 1)
            log.log(rollout_id, metrics)
            metrics = rollout.evaluate(rollout_id + 1) if schedule.eval_after(rollout_id) else {}
        if metrics:
            log.log(schedule.num_rollout, metrics)


def main(argv=None, entry="train", loop=None) -> int:
    """Parse and validate; `--dry-run` prints the plan, otherwise run `loop` (default: train).

    Returns the exit code: 0 done, 1 a trainer rank failed (logged with the rank and cause), 2 an
    invalid flag combination, a flag this machine cannot honor (see `startup_refusals`) or values
    megatron-core's configs refuse (see `check_megatron_configs`), one line naming the flags as
    argparse does, 130 interrupted
    (Ctrl-C); other errors propagate with their traceback. In every case the loop's JobScope has
    stopped the processes the job started."""
    from slime.utils.arguments import ArgumentError, startup_refusals

    try:
        args = parse_args(argv, entry=entry)
    except ArgumentError as e:
        print(f"{entry}.py: error: {e}", file=sys.stderr)
        return 2
    refusals = [] if args.dry_run else startup_refusals(args)
    for refusal in refusals:  # GPU-only features without CUDA, configurations not implemented
        print(f"{entry}.py: error: {refusal}", file=sys.stderr)
    if refusals:
        return 2
    from slime.backends.megatron_utils.config_check import ConfigRefused, check_megatron_configs

    try:  # megatron-core's own checks, before any process group (--dry-run: as the GPU run builds them)
        configs = check_megatron_configs(args)
    except ConfigRefused as e:
        print(f"{entry}.py: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        from slime.backends.sglang_utils.server_args import dry_run_commands

        plan = build_plan(args)
        plan.megatron_configs = configs
        print(render_plan(plan))
        print("\n".join(dry_run_commands(args)))  # lines "sglang command: ...", one per engine process
        return 0
    from slime.ray.actor_group import TrainerRankError

    try:
        (loop or train)(args)
    except TrainerRankError as e:  # the cause is named; the ranks' tracebacks are in their logs
        logging.getLogger(entry).error("job failed: %s", e)
        return 1
    except KeyboardInterrupt:
        logging.getLogger(entry).error("job interrupted; every process it started was stopped")
        return 130
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
