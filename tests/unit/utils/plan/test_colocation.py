"""The colocated timeline of the Qwen3-30B-A3B recipe (one GPU per phase of the hand-over), by
hand, and its verdicts: fits on 80 GiB, over budget when the engine's pool leaves no room for the
offloaded trainer's context, absent when not colocated."""

import pytest

from slime.utils.plan import build_plan, render_plan
from slime.utils.plan.memory import GIB


def _phases(plan) -> dict:
    return {phase.name.split(" (")[0]: phase for phase in plan.timeline}


def test_recipe_timeline_by_hand(qwen3_args):
    plan = build_plan(qwen3_args(extra=["--rollout-engine", "sglang"]))
    phases = _phases(plan)
    assert list(phases) == ["train", "weight sync", "rollout"]
    assert phases["train"].total == plan.trainer.total  # engines released: the trainer's budget
    sync = phases["weight sync"].parts
    # trainer bf16 weights (4,018,747,392 params x 2 B) + one 512 MiB bucket + the engine's weights
    assert sync["trainer weights"] == 2 * 4_018_747_392
    assert sync["sync buckets"] == 512 * 2**20
    assert sync["engine weights"] == plan.engine.weights
    assert sync["trainer context + NCCL"] == 2.5 * GIB and sync["engine residue"] == 2 * GIB
    # rollout: 0.7 x 80 GiB static pool + 4 GiB graphs/activations + the trainer's 2.5 GiB context
    assert phases["rollout"].total == pytest.approx((56 + 4 + 2.5) * GIB, abs=1)
    assert all(p.fits for p in phases.values()) and plan.fits
    text = render_plan(plan)
    assert "== Colocated timeline per GPU" in text and "trainer offloads optimizer + grads" in text


def test_fp8_engine_weights_and_buckets(qwen3_args):
    bf16 = _phases(build_plan(qwen3_args()))["weight sync"].parts
    fp8 = _phases(build_plan(qwen3_args(extra=["--sglang-quantization", "fp8"])))["weight sync"].parts
    assert fp8["engine weights"] < 0.6 * bf16["engine weights"]
    assert fp8["sync buckets"] == 1.5 * bf16["sync buckets"]  # the bf16 bucket and its fp8 copy + scales


def test_engine_pool_leaving_no_room_for_the_trainer_is_over_budget(qwen3_args):
    plan = build_plan(qwen3_args(extra=["--sglang-mem-fraction-static", "0.95"]))
    rollout = _phases(plan)["rollout"]
    assert not rollout.fits and not plan.fits
    assert "OVER BUDGET (82.5 of 80.0 GiB" in render_plan(plan)


def test_no_timeline_when_disaggregated(qwen3_args):
    plan = build_plan(qwen3_args(drop=["--colocate"], extra=["--rollout-num-gpus", "8"]))
    assert plan.timeline is None
    assert "none (not colocated)" in render_plan(plan)


def test_no_offload_flags_keep_memory_resident_in_the_timeline(qwen3_args):
    """--colocate --no-offload-train: the trainer's weights, optimizer and grads stay on the GPU
    through sync and rollout; --no-offload-rollout: the engine's pool stays through training."""
    offloaded = _phases(build_plan(qwen3_args()))
    plan = build_plan(qwen3_args(extra=["--no-offload-train", "--no-offload-rollout"]))
    phases = _phases(plan)
    trainer = plan.trainer.total
    assert phases["rollout"].total == pytest.approx(offloaded["rollout"].total - 2.5 * GIB + trainer, abs=1)
    assert phases["train"].total == pytest.approx(trainer + (56 + 4) * GIB, abs=1)
    assert not plan.fits  # a 30B trainer and a 0.7 pool do not share 80 GiB without the hand-over
    assert [p.name for p in plan.timeline] == ["train (engines resident)", "weight sync (trainer resident)",
                                               "rollout (trainer resident)"]
