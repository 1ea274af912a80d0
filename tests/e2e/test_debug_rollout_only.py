"""End to end, `train.py --debug-rollout-only`: engines and rollouts without a trainer; the
metrics hold rollout and eval rows and no train metrics, and nothing is checkpointed."""

import pytest

from tests.e2e.runner import grpo_argv, rollout_rows, run_train

pytestmark = pytest.mark.e2e


def test_debug_rollout_only_generates_without_trainer(e2e_inputs, tmp_path):
    extra = ["--debug-rollout-only", "--save-interval", "1", "--eval-interval", "1",
             "--eval-prompt-data", "toy", str(e2e_inputs.data / "eval.jsonl")]
    argv = grpo_argv(e2e_inputs.hf, e2e_inputs.torch_dist, e2e_inputs.data, tmp_path, 2, extra=extra)
    rows = run_train(argv, tmp_path, timeout=180)
    by_id = rollout_rows(rows)
    assert sorted(by_id) == [0, 1]
    for row in by_id.values():
        assert row["rollout/num_samples"] == 16 * 8
        assert 0.0 <= row["rollout/raw_reward"] <= 1.0
        assert not [k for k in row if k.startswith("train/")], row
    assert [r["rollout_id"] for r in rows if "eval/toy" in r] == [0, 1, 2]
    assert not list((tmp_path / "ckpt").glob("iter_*"))
