"""check_reward_nonzero_std: keeps groups with reward spread, drops uniform ones."""

from types import SimpleNamespace

import pytest

from slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std
from slime.utils.misc import load_function
from slime.utils.plugins import call_dynamic_filter
from slime.utils.types import Sample

ARGS = SimpleNamespace(reward_key=None)


def group(*rewards):
    return [Sample(reward=r) for r in rewards]


def test_keeps_group_with_spread():
    assert check_reward_nonzero_std(ARGS, group(1.0, 0.0, 1.0)).keep is True


def test_drops_uniform_group_with_reason():
    out = check_reward_nonzero_std(ARGS, group(1.0, 1.0))
    assert out.keep is False and out.reason == "zero_std_1.0"


def test_reads_reward_key_and_works_as_plugin():
    args = SimpleNamespace(reward_key="score")
    samples = [Sample(reward={"score": 1.0}), Sample(reward={"score": -1.0})]
    fn = load_function("slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std")
    assert call_dynamic_filter(fn, args, samples).keep is True


def test_single_sample_and_empty_group():
    assert check_reward_nonzero_std(ARGS, group(1.0)).keep is False
    with pytest.raises(ValueError, match="empty"):
        check_reward_nonzero_std(ARGS, [])
