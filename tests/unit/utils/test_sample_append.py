"""slime's `Sample` surface: nested classes, Status semantics, from_dict, append_response_tokens."""

import base64
from types import SimpleNamespace

import numpy as np
import pytest

from slime.utils.misc import decode_int32_meta_array
from slime.utils.types import Sample


def _b64(values):
    return base64.b64encode(np.asarray(values, dtype=np.int32).tobytes()).decode()


def test_status_is_a_plain_enum_and_nested_classes_exist():
    assert Sample.Status.COMPLETED != "completed"
    info = Sample.SpecInfo.from_dict({"spec_verify_ct": 2, "completion_token_num": 5, "future": 1})
    assert info.spec_accept_length == 2.5 and Sample.SpecInfo().spec_accept_length == 0.0
    assert info.to_dict()["spec_verify_ct"] == 2
    cache = Sample.PrefixCacheInfo.from_dict({"cached_tokens": 1, "total_prompt_tokens": 4, "x": 0})
    assert cache.prefix_cache_hit_rate == 0.25 and cache.to_dict() == {"cached_tokens": 1, "total_prompt_tokens": 4}


def test_from_dict_is_static_and_requires_status():
    d = Sample(prompt="p", spec_info=Sample.SpecInfo(spec_verify_ct=1)).to_dict()
    d["spec_info"]["unknown_counter"] = 3
    assert Sample.from_dict(d).spec_info.spec_verify_ct == 1
    del d["status"]
    with pytest.raises(KeyError):
        Sample.from_dict(d)


def test_append_trainable_then_tool_tokens():
    s = Sample(tokens=[1, 2])
    meta = {"finish_reason": {"type": "stop"}, "weight_version": 3, "cached_tokens": 1, "prompt_tokens": 2}
    s.append_response_tokens(tokens=[5, 6], log_probs=[-0.1, -0.2], text="ab", meta_info=meta)
    assert s.tokens == [1, 2, 5, 6] and s.response == "ab" and s.response_length == 2
    assert s.loss_mask == [1, 1] and s.rollout_log_probs == [-0.1, -0.2]
    assert s.status is Sample.Status.COMPLETED and s.weight_versions == [3]
    s.append_response_tokens(tokens=np.array([7]), trainable=False, text="c")
    assert s.loss_mask == [1, 1, 0] and s.rollout_log_probs == [-0.1, -0.2, 0.0]
    s.append_response_tokens(tokens=[8], log_probs=[-1.0], meta_info={"finish_reason": {"type": "length"}},
                             update_terminal_info=False)
    assert s.status is Sample.Status.COMPLETED and s.response_length == 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tokens": [1, 2], "log_probs": [-0.1]},
        {"tokens": [1]},
        {"tokens": [1], "log_probs": [-0.1], "trainable": False},
    ],
)
def test_append_rejects_inconsistent_input(kwargs):
    with pytest.raises(ValueError):
        Sample().append_response_tokens(**kwargs)


def test_append_trainable_onto_response_without_logprobs_is_refused():
    s = Sample(response_length=2)
    with pytest.raises(ValueError, match="without log-probs"):
        s.append_response_tokens(tokens=[1], log_probs=[-0.5])
    s.append_response_tokens(tokens=[1], trainable=False)
    assert s.loss_mask == [1, 1, 0] and s.rollout_log_probs == [0.0, 0.0, 0.0]


def test_top_p_merge_and_padding():
    s = Sample()
    meta = {"top_p_token_ids": _b64([4, 5, 6]), "top_p_token_offsets": [0, 2, 3]}
    s.append_response_tokens(tokens=[1, 2], log_probs=[0.0, 0.0], meta_info=meta)
    s.append_response_tokens(tokens=[9], trainable=False)
    meta2 = {"top_p_kept_token_ids": np.array([7], dtype=np.int32), "top_p_kept_token_offsets": b"".join(
        np.asarray([0, 1], dtype=np.int32).tobytes() for _ in [0])}
    s.append_response_tokens(tokens=[3], log_probs=[0.0], meta_info=meta2)
    assert s.rollout_top_p_token_ids == [4, 5, 6, 7]
    assert s.rollout_top_p_token_offsets == [0, 2, 3, 3, 4]
    with pytest.raises(ValueError, match="together"):
        Sample().append_response_tokens(tokens=[1], log_probs=[0.0], meta_info={"top_p_token_ids": [1]})
    with pytest.raises(ValueError, match="offsets"):
        Sample().append_response_tokens(tokens=[1], log_probs=[0.0],
                                        meta_info={"top_p_token_ids": [1], "top_p_token_offsets": [0, 2]})


def test_routed_experts_reshaped_and_need_args():
    args = SimpleNamespace(num_layers=2, moe_router_topk=1)
    s = Sample(tokens=[1, 2])
    s.append_response_tokens(args, tokens=[3], log_probs=[0.0], meta_info={"routed_experts": _b64([0, 1, 2, 3])})
    assert np.asarray(s.rollout_routed_experts).shape == (2, 2, 1)
    s.append_response_tokens(args, tokens=[4], log_probs=[0.0],
                             meta_info={"routed_experts": _b64([5, 6]), "routed_experts_start_len": 2})
    assert np.asarray(s.rollout_routed_experts).reshape(-1).tolist() == [0, 1, 2, 3, 5, 6]
    with pytest.raises(ValueError, match="need args"):
        Sample(tokens=[1, 2]).append_response_tokens(tokens=[3], log_probs=[0.0], meta_info={"routed_experts": [1]})


def test_decode_int32_meta_array_forms():
    assert decode_int32_meta_array({"a": _b64([1, -2])}, ["a"]) == [1, -2]
    assert decode_int32_meta_array({"b": [[1], [2]]}, ["a", "b"]) == [1, 2]
    assert decode_int32_meta_array({}, ["a"]) is None


def test_module_contents_at_slime_path():
    from slime.utils.types import MultimodalTypes, ParamInfo, RolloutBatch

    assert MultimodalTypes.get("image").placeholder == "<image>" and MultimodalTypes.get("x") is None
    assert [m.name for m in MultimodalTypes.all()] == ["image", "video", "audio"]
    info = ParamInfo(name="w", dtype="bf16", shape=(2,), attrs={}, size=4, src_rank=0)
    with pytest.raises(Exception):
        info.name = "v"  # frozen
    assert RolloutBatch is not None
