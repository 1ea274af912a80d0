"""Sample: field order and defaults (slime-compat §4), dict round trip, rewards, status mapping."""

import dataclasses
import pickle
from types import SimpleNamespace

import pytest

from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils import types
from slime.utils.types import Sample

SLIME_FIELDS = [
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
    "multimodal_train_inputs", "multimodal_train_input_id", "apply_chat_template_kwargs",
    "response", "response_length", "label", "reward", "loss_mask", "weight_versions",
    "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata",
    "generate_function_path", "custom_rm_path", "train_metadata", "session_id",
    "non_generation_time", "spec_info", "prefix_cache_info",
]


def test_field_order_and_defaults():
    assert [f.name for f in dataclasses.fields(Sample)] == SLIME_FIELDS
    s = Sample()
    assert s.status is Sample.Status.PENDING and s.response == "" and s.response_length == 0
    assert s.non_generation_time == 0.0 and s.remove_sample is False and s.reward is None
    assert s.tokens == [] and s.metadata == {} and s.weight_versions == []
    assert Sample().metadata is not s.metadata  # default_factory, not a shared dict


def test_status_values_are_slime_strings():
    assert {m.name: m.value for m in Sample.Status} == {
        "PENDING": "pending", "COMPLETED": "completed", "TRUNCATED": "truncated",
        "ABORTED": "aborted", "FAILED": "failed",
    }
    assert Sample.Status("aborted") is Sample.Status.ABORTED


def test_round_trip_keeps_fields_and_unknown_keys():
    s = Sample(
        group_index=1, index=3, rollout_id=2, prompt=[{"role": "user", "content": "hi"}],
        tokens=[1, 2, 3], response="x", response_length=1, label="7", reward={"score": 1.0},
        loss_mask=[1], rollout_log_probs=[-0.5], status=Sample.Status.TRUNCATED,
        metadata={"rm_type": "math"},
    )
    s.spec_info.add({"spec_accept_token_num": 3, "spec_draft_token_num": 4})
    d = s.to_dict()
    assert d["status"] == "truncated" and d["spec_info"]["spec_draft_token_num"] == 4
    d["from_the_future"] = {"a": 1}
    back = Sample.from_dict(d)
    assert back.from_the_future == {"a": 1}
    assert back.status is Sample.Status.TRUNCATED and back.spec_info.spec_accept_rate == 0.75
    again = back.to_dict()
    assert again == d
    assert pickle.loads(pickle.dumps(back)).to_dict() == d
    with pytest.raises(ValueError, match="to_dict"):
        Sample.from_dict({"prompt": "x", "status": "pending", "to_dict": 1})


@pytest.mark.parametrize(
    "reason,status",
    [("stop", Sample.Status.COMPLETED), ("length", Sample.Status.TRUNCATED), ("abort", Sample.Status.ABORTED)],
)
def test_status_from_finish_reason(reason, status):
    assert Sample.status_from_finish_reason(reason) is status


def test_unknown_finish_reason_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown SGLang finish_reason 'eos'"):
        Sample.status_from_finish_reason("eos")


def test_get_reward_value_with_and_without_reward_key():
    assert Sample(reward=0.5).get_reward_value(SimpleNamespace(reward_key=None)) == 0.5
    dict_sample = Sample(index=4, reward={"score": -1.0, "acc": False})
    assert dict_sample.get_reward_value(SimpleNamespace(reward_key="score")) == -1.0
    with pytest.raises(KeyError, match="--reward-key 'pred'"):
        dict_sample.get_reward_value(SimpleNamespace(reward_key="pred"))
    with pytest.raises(TypeError, match="--reward-key 'score'"):
        Sample(reward=1.0).get_reward_value(SimpleNamespace(reward_key="score"))


def test_effective_response_length_and_counters():
    assert Sample(response_length=4).effective_response_length == 4
    assert Sample(response_length=4, loss_mask=[1, 0, 0, 1]).effective_response_length == 2
    info = types.PrefixCacheInfo()
    info.add({"cached_tokens": 3, "prompt_tokens": 4})
    info.add({"prompt_tokens": 4})
    assert info.prefix_cache_hit_rate == 3 / 8
    assert types.SpecInfo().spec_accept_rate == 0.0


def test_plugin_types_are_the_same_objects_at_slime_paths():
    assert RolloutFnTrainOutput is types.RolloutFnTrainOutput
    assert DynamicFilterOutput is types.DynamicFilterOutput
    assert DynamicFilterOutput(keep=True).reason is None
