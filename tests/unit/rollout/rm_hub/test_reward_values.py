"""A reward that is NaN, infinite or not a reward fails naming the flag, the function and the
sample's index (it would otherwise surface as an AttributeError inside statistics.pstdev)."""

import asyncio
import math

import pytest

from slime.rollout.rm_hub import RewardValueError, async_rm, batched_async_rm
from slime.rollout.rm_hub.checks import checked_reward
from slime.utils.types import Sample
from tests.unit.rollout.rm_hub.test_async_rm import HELPERS, make_args


def test_nan_reward_names_flag_function_and_sample():
    sample = Sample(response="x", index=7, group_index=1)
    with pytest.raises(RewardValueError) as err:
        asyncio.run(async_rm(make_args(custom_rm_path=f"{HELPERS}.nan_rm"), sample))
    assert str(err.value).startswith(f"--custom-rm-path {HELPERS}.nan_rm returned nan for sample 7 (group 1)")


def test_infinite_reward_in_a_group_names_its_sample():
    samples = [Sample(response="a", index=i) for i in (10, 11, 12)]
    with pytest.raises(RewardValueError, match=r"group_inf_rm returned inf for sample 11"):
        asyncio.run(batched_async_rm(make_args(custom_rm_path=f"{HELPERS}.group_inf_rm", group_rm=True), samples))


def test_dict_reward_with_nan_value():
    with pytest.raises(RewardValueError, match=r"a dict whose 'score' is nan for sample 3"):
        asyncio.run(async_rm(make_args(custom_rm_path=f"{HELPERS}.dict_nan_rm"), Sample(response="x", index=3)))


def test_built_in_type_named_and_finite_rewards_pass():
    assert checked_reward(0.5, source="--rm-type math", sample=Sample()) == 0.5
    assert checked_reward({"score": 1.0, "pred": "3"}, source="--rm-type dapo", sample=Sample()) == {"score": 1.0, "pred": "3"}
    with pytest.raises(RewardValueError, match=r"--rm-type math returned str 'one' for sample 2"):
        checked_reward("one", source="--rm-type math", sample=Sample(index=2))
    with pytest.raises(RewardValueError, match=r"-inf"):
        checked_reward(-math.inf, source="--rm-type math", sample=Sample(index=2))
