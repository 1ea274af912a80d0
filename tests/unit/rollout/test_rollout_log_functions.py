"""--custom-rollout-log-function-path / --custom-eval-rollout-log-function-path (slime signatures)."""

from types import SimpleNamespace

from slime.rollout.train_data import logged_rollout_metrics
from slime.utils.types import Sample

CALLS = []


def skip_default(rollout_id, args, samples, extra_metrics, rollout_time):
    CALLS.append((rollout_id, len(samples), extra_metrics, rollout_time))
    return True


def keep_default(rollout_id, args, samples, extra_metrics, rollout_time):
    return False


def test_custom_rollout_log_function_can_skip_the_default_metrics():
    samples = [Sample(reward=1.0, response_length=2), Sample(reward=0.0, response_length=4)]
    args = SimpleNamespace(reward_key=None, custom_rollout_log_function_path=f"{__name__}.skip_default")
    got = logged_rollout_metrics(args, 3, samples, {"rollout/extra": 1.0}, 2.0)
    assert CALLS == [(3, 2, {"rollout/extra": 1.0}, 2.0)]
    assert set(got) == {"perf/rollout_time", "perf/rollout_tokens_per_s"}
    args.custom_rollout_log_function_path = f"{__name__}.keep_default"
    got = logged_rollout_metrics(args, 3, samples, {"rollout/extra": 1.0}, 2.0)
    assert got["rollout/raw_reward"] == 0.5 and got["rollout/extra"] == 1.0
