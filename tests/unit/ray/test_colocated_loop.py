"""The colocated loop's order of memory hand-over calls: `train.train` runs with the real
RolloutSide and ActorSide over a recording trainer group and rollout manager, and the calls each
rollout makes are exactly the documented hand-over (docs/architecture.md)."""

from types import SimpleNamespace

import pytest

import train as train_entry
from slime.ray import job
from slime.ray.critic import CriticSide
from slime.ray.job import ActorSide, RolloutSide

ENGINE_ALL = ["weights", "kv_cache", "cuda_graph"]
SYNC = lambda v: [  # noqa: E731 -- one weight sync with the hand-over around it
    ("trainer", "offload", ["optimizer", "grads"]), ("engines", "onload", ["weights"]),
    ("trainer", "update_weights", v), ("trainer", "offload", ["weights"]),
    ("trainer", "memory_held", "after_offload"), ("engines", "onload", ["kv_cache", "cuda_graph"])]
ROLLOUT = lambda r: [  # noqa: E731
    ("engines", "generate", r), ("engines", "offload", ENGINE_ALL), ("engines", "memory_occupation"),
    ("trainer", "onload", ["weights", "optimizer", "grads"]), ("trainer", "train", r)] + SYNC(str(r + 1))


class Manager:
    """A RolloutManager handle: `manager.<method>.remote(...)` records and answers."""

    ANSWERS = {"num_rollout": 2, "generate": ({}, {}), "healthy_engine_urls": ["http://e:1"],
               "memory_occupation": {"held": {"weights": 0}, "released": {"weights": 1}}}

    def __init__(self, calls):
        self.calls = calls

    def __getattr__(self, method):
        def remote(*args, **kwargs):
            if method in ("offload", "onload", "generate", "memory_occupation"):
                self.calls.append(("engines", method, *args[:1]))
            return self.ANSWERS.get(method)
        return SimpleNamespace(remote=remote)


class Group:
    def __init__(self, calls):
        self.calls = calls

    def init(self):
        self.calls.append(("trainer", "init"))
        return 0

    def run(self, method, *args):
        self.calls.append(("trainer", method, *args[-1:]))
        return {}

    def train(self, rollout_id, data):
        self.calls.append(("trainer", "train", rollout_id))
        return {}


class Job:
    def __init__(self, args, calls):
        self.args, self.calls = args, calls

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self, side_cls):
        side = side_cls.__new__(side_cls)
        side.args = self.args
        if side_cls is RolloutSide:
            side.manager, side.released, side.weights_from = Manager(self.calls), set(), None
        elif side_cls is CriticSide:
            side.group = None  # no --advantage-estimator ppo here
        else:
            side.group, side.synced, side.train_offloaded = Group(self.calls), None, set()
        return side

    def metrics_logger(self, **_):
        return SimpleNamespace(log=lambda *a: None, begin=lambda *a: None)


def _args(**overrides):
    base = dict(colocate=True, offload_rollout=True, offload_train=True, debug_rollout_only=False,
                debug_train_only=False, use_fault_tolerance=False, start_rollout_id=None, num_rollout=2,
                update_weights_interval=1, save=None, save_interval=None, eval_prompt_data=None, eval_interval=None,
                skip_eval_before_train=False)
    return SimpleNamespace(**(base | overrides))


def _run(monkeypatch, args) -> list:
    calls = []
    monkeypatch.setattr(job, "JobScope", lambda a, early=None: Job(a, calls))
    monkeypatch.setattr(job.ray, "get", lambda ref, **_: ref)
    train_entry.train(args)
    return calls


def test_colocated_loop_hands_the_gpus_over_in_order(monkeypatch):
    calls = _run(monkeypatch, _args())
    want = [("engines", "offload", ENGINE_ALL), ("trainer", "init")] + SYNC("0") + ROLLOUT(0) + ROLLOUT(1)
    assert calls == want


@pytest.mark.parametrize("offload_train", [False, True])
def test_disaggregated_loop_moves_only_what_is_asked(monkeypatch, offload_train):
    """Without --colocate the engines keep their memory; --offload-train alone still offloads the
    trainer after each sync and takes it back before training."""
    calls = _run(monkeypatch, _args(colocate=False, offload_rollout=False, offload_train=offload_train))
    memory = [c for c in calls if c[1] in ("offload", "onload", "memory_occupation")]
    assert all(c[0] == "trainer" for c in memory)
    assert bool(memory) == offload_train
    if offload_train:
        assert calls.index(("trainer", "onload", ["weights", "optimizer", "grads"])) < calls.index(("trainer", "train", 0))
