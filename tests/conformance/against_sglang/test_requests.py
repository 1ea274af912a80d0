"""Every JSON body we send an engine becomes SGLang's request object with the values we mean.

SGLang's HTTP server hands each body, parsed from JSON, to pydantic as the endpoint's
`sglang.srt.managers.io_struct` class (`obj: Annotated[Cls, Body()]`); unknown fields are dropped
silently, so each check also requires every field we send to be a field of that class. The bodies
come from `slime.utils.engine_requests`, which `EngineClient` sends.
"""

import json
import types

import pydantic
import pytest

from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils import engine_requests as bodies


def _io(name: str):
    from sglang.srt.managers import io_struct

    return getattr(io_struct, name)


def _field_names(cls) -> set[str]:
    import dataclasses

    import msgspec

    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return {f.name for f in msgspec.structs.fields(cls)}


def parse(cls_name: str, body: dict):
    """What SGLang's endpoint receives for `body`: the JSON round trip, then pydantic into the class."""
    cls = _io(cls_name)
    unknown = set(body) - _field_names(cls)
    assert not unknown, f"{cls_name} has no field(s) {sorted(unknown)}: SGLang would drop them"
    return pydantic.TypeAdapter(cls).validate_python(json.loads(json.dumps(body)))


# (io_struct class, our body, {field: the value SGLang must see})
CASES = {
    "init_weights_update_group": (
        "InitWeightsUpdateGroupReqInput",
        bodies.init_weights_update_group("10.0.0.1", 29555, 3, 9, "slime-weights-pp1", "nccl"),
        {"master_address": "10.0.0.1", "master_port": 29555, "rank_offset": 3, "world_size": 9,
         "group_name": "slime-weights-pp1", "backend": "nccl"}),
    "update_weights_from_distributed": (
        "UpdateWeightsFromDistributedReqInput",
        bodies.update_weights_from_distributed(["a.weight", "b.bias"], ["bfloat16", "float32"], [[4, 2], [3]],
                                               "slime-weights-pp0", flush_cache=False, weight_version="12"),
        {"names": ["a.weight", "b.bias"], "dtypes": ["bfloat16", "float32"], "shapes": [[4, 2], [3]],
         "group_name": "slime-weights-pp0", "flush_cache": False, "weight_version": "12", "load_format": None,
         "abort_all_requests": False}),
    "destroy_weights_update_group": (
        "DestroyWeightsUpdateGroupReqInput", bodies.destroy_weights_update_group("slime-weights-pp0"),
        {"group_name": "slime-weights-pp0"}),
    "update_weights_from_tensor": (
        "UpdateWeightsFromTensorReqInput",
        bodies.update_weights_from_tensor(["aGVsbG8=", "d29ybGQ="], load_format="flattened_bucket",
                                          flush_cache=False, weight_version="3"),
        {"serialized_named_tensors": [b"hello", b"world"], "load_format": "flattened_bucket",
         "flush_cache": False, "weight_version": "3", "abort_all_requests": False}),
    "update_weights_from_disk": (
        "UpdateWeightFromDiskReqInput", bodies.update_weights_from_disk("/ckpt/hf_iter_5", weight_version="5"),
        {"model_path": "/ckpt/hf_iter_5", "load_format": None, "weight_version": "5", "flush_cache": True,
         "abort_all_requests": False}),
    "pause_generation": ("PauseGenerationReqInput", bodies.pause_generation(), {"mode": "abort"}),
    "pause_generation_in_place": ("PauseGenerationReqInput", bodies.pause_generation("in_place"),
                                  {"mode": "in_place"}),
    "continue_generation": ("ContinueGenerationReqInput", bodies.continue_generation(), {}),
    "abort_all": ("AbortReq", bodies.abort_request(abort_all=True), {"abort_all": True}),
    "abort_one": ("AbortReq", bodies.abort_request(rid="r-17"), {"rid": "r-17", "abort_all": False}),
    "release_memory_all": ("ReleaseMemoryOccupationReqInput", bodies.release_memory_occupation(), {"tags": None}),
    "release_memory_kv": ("ReleaseMemoryOccupationReqInput", bodies.release_memory_occupation(["kv_cache"]),
                          {"tags": ["kv_cache"]}),
    "resume_memory_weights": ("ResumeMemoryOccupationReqInput", bodies.resume_memory_occupation(["weights"]),
                              {"tags": ["weights"]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_control_bodies_become_sglang_requests(case):
    cls_name, body, expected = CASES[case]
    obj = parse(cls_name, body)
    for field, value in expected.items():
        assert getattr(obj, field) == value, f"{cls_name}.{field}"


class _Tokenizer:
    """What SamplingParams.normalize asks of a tokenizer (stop strings' token lengths)."""

    def encode(self, text, add_special_tokens=False):
        return list(range(len(text)))


def _rollout_args(**over):
    args = dict(rollout_temperature=0.8, rollout_top_p=0.95, rollout_top_k=20, rollout_max_response_len=64,
                rollout_stop=["</answer>"], rollout_stop_token_ids=[2, 7], rollout_skip_special_tokens=False)
    return types.SimpleNamespace(**{**args, **over})


@pytest.mark.parametrize("evaluation", [False, True])
def test_generate_body_becomes_generate_req_input_and_sampling_params(evaluation):
    """The rollout's /generate body (engine_requests.generate over sampling_params_from_args plus the
    per-sample seed) -> GenerateReqInput, and its sampling_params -> SGLang's SamplingParams the way
    the tokenizer manager builds them (`SamplingParams(**params)`, normalize, verify)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    args = _rollout_args(eval_temperature=0.6, eval_top_p=None, eval_top_k=None, eval_max_response_len=32)
    params = {**sampling_params_from_args(args, evaluation), "sampling_seed": 1234}
    body = bodies.generate([5, 6, 7], params, return_logprob=True)
    obj = parse("GenerateReqInput", body)
    assert obj.input_ids == [5, 6, 7] and obj.return_logprob is True and obj.text is None
    sampling = SamplingParams(**obj.sampling_params)
    sampling.normalize(_Tokenizer())
    sampling.verify(1000)
    assert sampling.temperature == (0.6 if evaluation else 0.8)
    assert sampling.top_p == 0.95 and sampling.top_k == 20
    assert sampling.max_new_tokens == (32 if evaluation else 64)
    assert set(sampling.stop_token_ids) == {2, 7} and sampling.stop_strs == ["</answer>"]
    assert sampling.skip_special_tokens is False and sampling.no_stop_trim is True
    assert sampling.spaces_between_special_tokens is False and sampling.sampling_seed == 1234


def test_generate_body_passes_sglangs_json_contract(sglang_version):
    """0.5.23 also checks /generate bodies against its proto schema (`generate_contract_error`);
    0.5.15.post1 has no such gate."""
    body = bodies.generate([5, 6, 7], sampling_params_from_args(_rollout_args()), return_logprob=True)
    try:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
    except ImportError:
        pytest.skip(f"sglang {sglang_version} has no /generate JSON contract gate")
    assert generate_contract_error(json.loads(json.dumps(body))) is None


def test_group_batch_body_keeps_each_samples_sampling_params(sglang_version):
    """--rollout-group-requests' body (`engine_requests.generate_batch`: a list of token-id lists,
    one sampling-params dict per prompt, each with its own seed and budget) -> a batched
    GenerateReqInput whose normalisation gives prompt i its own params (SGLang's
    `_normalize_sampling_params` keeps a list), each a valid SamplingParams; and it passes 0.5.23's
    JSON contract gate."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    base = sampling_params_from_args(_rollout_args())
    params = [{**base, "sampling_seed": 11, "max_new_tokens": 5}, {**base, "sampling_seed": 12, "max_new_tokens": 3}]
    body = bodies.generate_batch([[5, 6, 7], [5, 6, 7, 8]], params, return_logprob=True)
    obj = parse("GenerateReqInput", body)
    obj.normalize_batch_and_arguments()
    assert obj.is_single is False and obj.batch_size == 2
    for i, (ids, expected) in enumerate(zip(body["input_ids"], params)):
        item = obj[i]
        assert item.input_ids == ids and item.return_logprob is True and item.sampling_params == expected
        sampling = SamplingParams(**item.sampling_params)
        sampling.normalize(_Tokenizer())
        sampling.verify(1000)
        assert sampling.sampling_seed == expected["sampling_seed"]
        assert sampling.max_new_tokens == expected["max_new_tokens"]
    try:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
    except ImportError:
        return  # 0.5.15.post1: no contract gate
    assert generate_contract_error(json.loads(json.dumps(body))) is None


def test_routed_experts_request_parses_and_passes_the_contract(sglang_version):
    """R3's /generate body asks for routed experts: a GenerateReqInput field on both releases (the
    whole sequence: routed_experts_start_len stays 0), accepted by 0.5.23's JSON contract gate."""
    body = bodies.generate([5, 6, 7], sampling_params_from_args(_rollout_args()), return_logprob=True,
                           return_routed_experts=True)
    obj = parse("GenerateReqInput", body)
    assert obj.return_routed_experts is True and obj.routed_experts_start_len == 0
    try:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
    except ImportError:
        return  # 0.5.15.post1: no contract gate
    assert generate_contract_error(json.loads(json.dumps(body))) is None


def test_routed_experts_come_back_in_the_local_engines_encoding():
    """SGLang's own decoder of meta_info["routed_experts"] (0.5.23) reads what the local engine
    sends: base64 of int32 [rows, layers, topk]."""
    import numpy as np
    import torch

    from slime.backends.local_engine.routed_experts import routed_experts_meta

    try:
        from sglang.srt.state_capturer.routed_experts import extract_routed_experts_from_meta_info
    except ImportError:
        pytest.skip("this release has no extract_routed_experts_from_meta_info")
    rows = torch.arange(4 * 2 * 2, dtype=torch.int32).view(4, 2, 2)  # 3 prompt + 2 output tokens, 4 fed
    req = types.SimpleNamespace(rid="r", return_routed_experts=True, routed_experts=[rows[:3], rows[3:]],
                                prompt_ids=[1, 2, 3], output_ids=[4, 5], routed_experts_start_len=1)
    got = extract_routed_experts_from_meta_info({"meta_info": routed_experts_meta(req)})
    assert np.array_equal(got.reshape(3, 2, 2), rows[1:].numpy())


def test_a_misspelt_field_is_caught():
    """The check itself: a field SGLang does not know would be dropped, so it fails here."""
    with pytest.raises(AssertionError, match="flush_caches"):
        parse("UpdateWeightsFromDistributedReqInput",
              {"names": [], "dtypes": [], "shapes": [], "flush_caches": False})


def test_opd_teacher_request_parses_and_passes_the_contract(sglang_version):
    """On-policy distillation's teacher body (`opd_teacher.teacher_request`): prompt + response fed
    with max_new_tokens 0, return_logprob and logprob_start_len one before the response, as
    SGLang's GenerateReqInput and SamplingParams take them (and 0.5.23's JSON contract gate)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    from slime.rollout.opd_teacher import teacher_request
    from slime.utils.types import Sample

    body = teacher_request(Sample(index=0, tokens=[5, 6, 7, 8, 9], response_length=2))
    obj = parse("GenerateReqInput", body)
    assert obj.input_ids == [5, 6, 7, 8, 9] and obj.return_logprob is True and obj.logprob_start_len == 2
    sampling = SamplingParams(**obj.sampling_params)
    sampling.normalize(_Tokenizer())
    sampling.verify(1000)
    assert sampling.max_new_tokens == 0 and sampling.temperature == 1.0
    try:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
    except ImportError:
        return  # 0.5.15.post1: no contract gate
    assert generate_contract_error(json.loads(json.dumps(body))) is None
