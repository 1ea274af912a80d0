"""The trainer's Ray actors get the environment the GPU path needs (no Ray cluster started: the
options each actor is created with are recorded)."""

from types import SimpleNamespace

from slime.ray import actor_group


def test_trainer_ranks_run_with_nccl_cumem_disabled(monkeypatch):
    """SGLang's engines run with NCCL_CUMEM_ENABLE=0; the trainer ranks that join their NCCL
    weight-sync group must too."""
    seen = []

    class Recorder:
        def options(self, **options):
            seen.append(options)
            return SimpleNamespace(remote=lambda rank, world, role: (role, rank, world))

    monkeypatch.setattr(actor_group, "TrainActor", Recorder())
    placement = SimpleNamespace(use_gpu=True, strategy=lambda position: f"bundle-{position}")
    group = actor_group.RayTrainGroup(SimpleNamespace(colocate=False), placement, bundles=(0, 1))
    assert group.actors == [("actor", 0, 2), ("actor", 1, 2)]
    for options in seen:
        env = options["runtime_env"]["env_vars"]
        assert env["NCCL_CUMEM_ENABLE"] == "0" and env["OMP_NUM_THREADS"] == "1"


def test_deterministic_mode_turns_off_te_nondeterministic_algorithms():
    """megatron-core's TEDotProductAttention raises under --deterministic-mode unless
    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (extensions/transformer_engine.py, 0.16.1)."""
    env = actor_group.trainer_env(SimpleNamespace(deterministic_mode=True))
    assert env["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0" and env["NCCL_CUMEM_ENABLE"] == "0"
    assert "NVTE_ALLOW_NONDETERMINISTIC_ALGO" not in actor_group.trainer_env(SimpleNamespace(deterministic_mode=False))


class _RemoteFailure(Exception):
    """Stands for a RayTaskError: the remote traceback in its text, the user's exception as `cause`."""

    def __init__(self, traceback_text: str, cause: BaseException):
        super().__init__(traceback_text)
        self.cause = cause


def test_bare_assert_names_where_it_was_raised():
    """A bare `assert` in a rank (seen: a save on a recipe twin) reports its file and line, not just
    "AssertionError: "; an exception with a message stays one line as before."""
    from slime.ray.actor_group import TrainerRankError

    text = ('Traceback (most recent call last):\n  File "/x/slime/a.py", line 3, in save\n    f()\n'
            '  File "/x/megatron/core/b.py", line 42, in check\n    assert ok\nAssertionError')
    bare = TrainerRankError("save", [(0, _RemoteFailure(text, AssertionError()))])
    assert "AssertionError:  (raised at /x/megatron/core/b.py:42 in check)" in str(bare)
    said = TrainerRankError("save", [(0, _RemoteFailure(text, ValueError("boom")))])
    assert str(said) == "trainer save failed on rank 0 raised: ValueError: boom"
