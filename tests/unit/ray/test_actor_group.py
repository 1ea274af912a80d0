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
