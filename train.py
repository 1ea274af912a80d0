"""Synchronous RL training: place -> rollout manager -> actor -> sync weights -> for each rollout:
generate, train, save, sync weights, eval.

Before anything starts, the pre-flight (`slime.utils.preflight`, docs/preflight.md) checks every
input in seconds and the run folders (`--metrics-dir`, `--save`) are locked for the job's life.
`python train.py <flags> --dry-run` parses and validates every flag, builds megatron-core's config
objects as the GPU run would, prints the resolved plan (placement, parallel layout, batch
arithmetic, memory, the configs built), one `sglang command: ` line per engine
process (the exact launch line, hosts and ports as placeholders) and exits without starting Ray.
"""

import contextlib
import logging
import sys

from slime.models import validate_hf_checkpoint
from slime.utils.arguments import parse_args
from slime.utils.plan import build_plan, render_plan
from slime.utils.startup_profile import mark, start_clock


def train(args, early_ray=None) -> None:
    """Metrics row r holds rollout r and, when evaluated, the eval of the same weights that
    generated it (eval after rollout r-1); a final row holds the eval after the last rollout.
    `early_ray`: a `slime.ray.job_ray.RayStart` under way (`main` starts Ray while it checks)."""
    from slime.ray.critic import CriticSide
    from slime.ray.job import ActorSide, JobScope, RolloutSide, Schedule

    with JobScope(args, early_ray) as job:  # on leaving, for any reason, everything the job started stops
        rollout = job.start(RolloutSide)  # the engines and the router start meanwhile
        if args.num_rollout is None:  # --num-epoch resolved before the actor builds its LR schedule (waits for
            args.num_rollout = rollout.num_rollout()  # the rollout manager: its data source knows the length)
        actor = job.start(ActorSide)  # the trainer ranks build while the engines start
        critic = job.start(CriticSide)  # --advantage-estimator ppo only (else every call is a no-op)
        rollout.keep_weights_from(actor)  # --use-fault-tolerance: restarted engines get the weights
        schedule = Schedule(args, start_rollout_id=actor.init(rollout), num_rollout=args.num_rollout)
        critic.init()
        rollout.load(schedule.start_rollout_id)
        log = job.metrics_logger(total=schedule.num_rollout, start=schedule.start_rollout_id)
        actor.sync_weights(rollout, version=schedule.start_rollout_id)
        mark("first weight sync done")
        metrics = rollout.evaluate(schedule.start_rollout_id) if schedule.eval_before_training() else {}
        for rollout_id in schedule.rollouts():
            data, rollout_metrics = rollout.generate(rollout_id)
            if rollout_id == schedule.start_rollout_id:
                mark("first rollout generated")
            metrics |= rollout_metrics
            log.begin(rollout_id, metrics)  # written on failure too, if the rollout does not finish
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


def main(argv=None, entry="train", loop=None, early_ray=None) -> int:
    """Parse and validate, run the pre-flight; `--dry-run` prints the plan, otherwise run `loop`
    (default: train) holding the run folders' locks (`slime.utils.run_folder`). The machine's
    refusals and megatron-core's config check run in a thread
    (`slime.backends.megatron_utils.startup_checks`); with `early_ray` (default: when `loop` is
    train's) Ray starts meanwhile (`slime.ray.job_ray.RayStart`) and the loop is called as
    `loop(args, early_ray=...)`; a refusal stops Ray again.

    Returns the exit code: 0 done, 1 the job failed (one line, root cause first; the traceback in
    <--metrics-dir>/error.log, or raised with `--traceback`), 2 a user mistake: an invalid flag, a
    flag this machine cannot honor (`startup_refusals`), a pre-flight finding
    (`slime.utils.preflight`, one line each naming the flag, file and line), values megatron-core's
    configs refuse (`check_megatron_configs`, one line naming the flags) or a run folder in use
    or holding another run; 130 interrupted (Ctrl-C). In every case the loop's JobScope has
    stopped the processes the job started."""
    from slime.utils.arguments import ArgumentError
    from slime.utils.run_folder import RunFolderError, RunLock, run_folders

    argv = list(sys.argv[1:] if argv is None else argv)
    start_clock()  # the start-up profile's zero, unless the launching script set it
    mark(f"{entry}.py: imports done")
    try:
        args = parse_args(argv, entry=entry, model_check=validate_hf_checkpoint)
    except ArgumentError as e:
        return _refuse(entry, [str(e)])
    except SystemExit as e:  # argparse printed its one line (or --help its text)
        return e.code if isinstance(e.code, int) else 2
    if args.dry_run:
        return _dry_run(entry, args)
    try:
        with RunLock(run_folders(args), command=[f"{entry}.py", *argv]):
            return _checked_run(entry, args, loop, loop is None if early_ray is None else early_ray)
    except RunFolderError as e:
        return _refuse(entry, [str(e)])
    except KeyboardInterrupt:
        logging.getLogger(entry).error("job interrupted; every process it started was stopped")
        return 130
    except Exception as e:
        if args.traceback:
            raise
        return _job_failed(entry, e, args)


def _dry_run(entry: str, args) -> int:
    """`--dry-run`: the pre-flight and megatron-core's configs as the run builds them, then the plan
    and the SGLang launch lines; nothing is started."""
    from slime.backends.sglang_utils.server_args import dry_run_commands
    from slime.utils.preflight import run_preflight
    from slime.backends.megatron_utils.startup_checks import megatron_configs

    if problems := [f.line() for f in run_preflight(args).errors]:
        return _refuse(entry, problems)
    configs, refused = megatron_configs(args)
    if refused:
        return _refuse(entry, refused)
    plan = build_plan(args)
    plan.megatron_configs = configs
    print(render_plan(plan))
    print("\n".join(dry_run_commands(args)))  # lines "sglang command: ...", one per engine process
    return 0


def _checked_run(entry: str, args, loop, early: bool) -> int:
    """Inside the run folders' locks: the pre-flight, then the machine's refusals and
    megatron-core's checks (in a thread, while Ray starts when `early`), then `loop`."""
    from slime.utils.preflight import run_preflight
    from slime.utils.run_folder import claim_run_folder
    from slime.backends.megatron_utils.startup_checks import refusals_in_thread

    if problems := [f.line() for f in run_preflight(args).errors]:  # in seconds: before torch is imported
        return _refuse(entry, problems)
    with refusals_in_thread(args) as check, _ray_start(args, early) as ray_start:  # the checks while Ray starts
        if refused := check.result():  # before any process group or engine
            return _refuse(entry, refused)
        claim_run_folder(args)
        mark("flags, pre-flight and megatron config checks done")
        (loop or train)(args, **({} if ray_start is None else {"early_ray": ray_start}))
    return 0


def _ray_start(args, early: bool):
    """A `RayStart` under way when `early`, else a no-op context yielding None."""
    if not early:
        return contextlib.nullcontext()
    from slime.ray.job_ray import RayStart

    return RayStart(args)


def _refuse(entry: str, lines: list[str]) -> int:
    """A user mistake: one line each on stderr, exit code 2."""
    for line in lines:
        print(f"{entry}.py: error: {line}", file=sys.stderr)
    return 2


def _job_failed(entry: str, error: Exception, args) -> int:
    """A failed job: one line naming the root cause (a trainer rank's error names its rank), the
    traceback appended to <--metrics-dir>/error.log; exit code 1."""
    from slime.ray.actor_group import TrainerRankError
    from slime.utils.failure import one_line, save_traceback
    from slime.utils.run_folder import metrics_dir

    saved = save_traceback(error, metrics_dir(args))
    cause = str(error) if isinstance(error, TrainerRankError) else one_line(error)
    where = f" (traceback: {saved}; --traceback shows it here)" if saved else ""
    logging.getLogger(entry).error("job failed: %s%s", cause, where)
    return 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
