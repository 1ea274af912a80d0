"""Bugs of issue 11 part 5, each a test that failed before its fix: --num-epoch resolved before the
trainer builds its LR schedule; a custom --eval-function-path without --eval-prompt-data runs; a
--router-* value of 0 is passed on; debug rollout data loads with weights_only=True; a bad flag
combination exits 2 with one line naming the flag."""

import argparse
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import train
from slime.backends.sglang_utils.router import router_extra_args
from slime.ray import job
from slime.ray.rollout_manager import load_debug_samples, save_debug_samples
from slime.utils.types import Sample


class _Stop(Exception):
    pass


class _FakeScope:
    seen: dict = {}

    def __init__(self, args, early=None):
        self.args = args

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self, side):
        if side is job.ActorSide:
            _FakeScope.seen["num_rollout_at_actor_start"] = self.args.num_rollout
            raise _Stop
        return SimpleNamespace(num_rollout=lambda: 12)


def test_num_epoch_is_resolved_before_the_actor_starts(monkeypatch):
    monkeypatch.setattr(job, "JobScope", _FakeScope)
    args = argparse.Namespace(num_rollout=None, num_epoch=3)
    with pytest.raises(_Stop):
        train.train(args)
    assert _FakeScope.seen["num_rollout_at_actor_start"] == 12


def test_trainer_starts_while_the_engines_start(monkeypatch):
    """With --num-rollout given, train.py starts the trainer ranks without waiting for the rollout
    manager (whose constructor starts the engines and the router): the two start-ups overlap."""
    def not_now():
        raise AssertionError("asked the rollout manager before starting the trainer")

    class Scope(_FakeScope):
        def start(self, side):
            if side is job.ActorSide:
                _FakeScope.seen["actor_started"] = True
                raise _Stop
            return SimpleNamespace(num_rollout=not_now)

    monkeypatch.setattr(job, "JobScope", Scope)
    with pytest.raises(_Stop):
        train.train(argparse.Namespace(num_rollout=5, num_epoch=None))
    assert _FakeScope.seen["actor_started"]


def _schedule_args(**kw):
    base = dict(eval_interval=2, eval_prompt_data=None, eval_function_path="slime.rollout.sglang_rollout.generate_rollout",
                skip_eval_before_train=False, save=None, save_interval=None, num_rollout=4)
    return argparse.Namespace(**{**base, **kw})


def test_custom_eval_function_runs_without_eval_prompt_data():
    schedule = job.Schedule(_schedule_args(eval_function_path="my.evals.run"), start_rollout_id=0)
    assert schedule.eval_before_training() and schedule.eval_after(1)
    default = job.Schedule(_schedule_args(), start_rollout_id=0)
    assert not default.eval_before_training() and not default.eval_after(1)
    assert job.Schedule(_schedule_args(eval_prompt_data=["t", "p"]), start_rollout_id=0).eval_after(1)


def test_router_zero_values_are_passed_on():
    args = argparse.Namespace(router_policy="round_robin", router_max_concurrent_requests=0,
                              router_retry_max_retries=0, router_x_flag=True, router_off=False, router_none=None)
    extra = router_extra_args(args)
    assert extra[extra.index("--max-concurrent-requests") + 1] == "0"
    assert extra[extra.index("--retry-max-retries") + 1] == "0"
    assert "--x-flag" in extra and "--off" not in extra and "--none" not in extra


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled code ran",))


def test_debug_rollout_data_loads_weights_only(tmp_path):
    template = str(tmp_path / "debug_{rollout_id}.pt")
    sample = Sample(prompt="p", tokens=[1, 2], response_length=1, rollout_log_probs=[-0.5], status=Sample.Status.COMPLETED)
    sample.rollout_routed_experts = np.zeros((1, 2, 1), dtype=np.int32)
    save_debug_samples(template, 0, [sample])
    back = load_debug_samples(template, 0)[0]
    assert back.status is Sample.Status.COMPLETED and back.tokens == [1, 2]
    assert torch.as_tensor(back.rollout_routed_experts).shape == (1, 2, 1)
    torch.save({"rollout_id": 1, "samples": [{"status": "pending", "x": _Evil()}]}, template.format(rollout_id=1))
    with pytest.raises(pickle.UnpicklingError):
        load_debug_samples(template, 1)


def test_bad_flags_exit_2_with_one_line(capsys):
    assert train.main(["--eps-clip-c", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("train.py: error: --") and "Traceback" not in err


def test_train_py_syncs_weights_every_update_weights_interval_and_after_the_last():
    schedule = job.Schedule(_schedule_args(update_weights_interval=2, num_rollout=5), start_rollout_id=0)
    assert [r for r in schedule.rollouts() if schedule.sync_after(r)] == [1, 3, 4]
    every = job.Schedule(_schedule_args(update_weights_interval=1), start_rollout_id=0)
    assert all(every.sync_after(r) for r in every.rollouts())
