"""The JSON bodies we send rollout engines, built by pure functions (one per endpoint).

Each body is what SGLang's HTTP server turns into the request dataclass of
`sglang.srt.managers.io_struct` named in the function's docstring (FastAPI/pydantic, unknown
fields silently ignored: a misspelt field falls back to SGLang's default, which is why every field
name here is checked against SGLang's own classes in tests/conformance/against_sglang). Fields
whose SGLang default is not what we mean are always sent (e.g. `flush_cache`, whose default is
True, and pause's `mode`, whose default is "abort"). `EngineClient` sends these bodies; tests and
tools can build them without a server.
"""

from __future__ import annotations

PAUSE_MODES = ("abort", "retract", "in_place")


def generate(input_ids: list, sampling_params: dict, return_logprob: bool = False, rid=None,
             return_routed_experts: bool = False) -> dict:
    """POST /generate -> `GenerateReqInput` (token ids in; `sampling_params` -> SGLang `SamplingParams`).
    `return_routed_experts` asks for every fed token's MoE routing (the server needs
    --enable-return-routed-experts); it comes back as `meta_info["routed_experts"]` for the whole
    sequence (`routed_experts_start_len` 0)."""
    body = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob}
    if rid is not None:
        body["rid"] = rid
    if return_routed_experts:
        body["return_routed_experts"] = True
    return body


def generate_batch(input_ids: list[list[int]], sampling_params: list[dict], return_logprob: bool = False) -> dict:
    """POST /generate with several prompts -> one batched `GenerateReqInput`: `input_ids` a list of
    token-id lists and `sampling_params` a list with one dict per prompt (SGLang's
    `_normalize_sampling_params` keeps a list as given, so every prompt has its own seed and budget).
    The answer is a list with one result per prompt, in order. sglang-router 0.3.2 refuses a list
    of sampling params (422): send this body to an engine directly."""
    if not input_ids or len(input_ids) != len(sampling_params):
        raise ValueError(f"a batched /generate needs one sampling_params dict per prompt and at least one prompt; "
                         f"got {len(input_ids)} prompt(s) and {len(sampling_params)} dict(s)")
    return {"input_ids": [list(ids) for ids in input_ids], "sampling_params": list(sampling_params),
            "return_logprob": return_logprob}


def init_weights_update_group(master_address: str, master_port: int, rank_offset: int, world_size: int,
                              group_name: str, backend: str = "nccl") -> dict:
    """POST /init_weights_update_group -> `InitWeightsUpdateGroupReqInput`."""
    return {"master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend}


def update_weights_from_distributed(names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str,
                                    flush_cache: bool = False, weight_version: str | None = None,
                                    load_format: str | None = None) -> dict:
    """POST /update_weights_from_distributed -> `UpdateWeightsFromDistributedReqInput`."""
    return {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
            "group_name": group_name, "flush_cache": flush_cache, "load_format": load_format,
            "weight_version": None if weight_version is None else str(weight_version)}


def destroy_weights_update_group(group_name: str) -> dict:
    """POST /destroy_weights_update_group -> `DestroyWeightsUpdateGroupReqInput`."""
    return {"group_name": group_name}


def update_weights_from_tensor(serialized_named_tensors: list[str], load_format: str | None = None,
                               flush_cache: bool = False, weight_version: str | None = None) -> dict:
    """POST /update_weights_from_tensor -> `UpdateWeightsFromTensorReqInput` (one base64 entry per TP rank)."""
    return {"serialized_named_tensors": list(serialized_named_tensors), "load_format": load_format,
            "flush_cache": flush_cache, "weight_version": None if weight_version is None else str(weight_version)}


def begin_weight_update() -> dict:
    """POST /begin_weight_update -> `BeginWeightUpdateReqInput` (SGLang >= 0.5.23; selector "all":
    the target model and a draft model, if any)."""
    return {}


def end_weight_update() -> dict:
    """POST /end_weight_update -> `EndWeightUpdateReqInput` (closes the session begin opened)."""
    return {}


def update_weights_from_disk(model_path: str, load_format: str | None = None, weight_version: str | None = None,
                             flush_cache: bool = True) -> dict:
    """POST /update_weights_from_disk -> `UpdateWeightFromDiskReqInput`."""
    return {"model_path": str(model_path), "load_format": load_format, "flush_cache": flush_cache,
            "weight_version": None if weight_version is None else str(weight_version)}


def pause_generation(mode: str = "abort") -> dict:
    """POST /pause_generation -> `PauseGenerationReqInput`. "abort" (SGLang's default) finishes
    everything in flight so /flush_cache can succeed; "in_place" keeps running requests (then
    /flush_cache answers 400 until they finish); "retract" puts them back in the queue."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
    return {"mode": mode}


def continue_generation() -> dict:
    """POST /continue_generation -> `ContinueGenerationReqInput` (defaults)."""
    return {}


def abort_request(rid: str | None = None, abort_all: bool = False) -> dict:
    """POST /abort_request -> `AbortReq`: one request by `rid`, or every request."""
    if rid is None and not abort_all:
        raise ValueError("abort_request needs rid or abort_all=True")
    return {"abort_all": True} if abort_all else {"rid": rid, "abort_all": False}


def release_memory_occupation(tags: list[str] | None = None) -> dict:
    """POST /release_memory_occupation -> `ReleaseMemoryOccupationReqInput` (tags None = all)."""
    return {} if tags is None else {"tags": list(tags)}


def resume_memory_occupation(tags: list[str] | None = None) -> dict:
    """POST /resume_memory_occupation -> `ResumeMemoryOccupationReqInput` (tags e.g. ["weights", "kv_cache"])."""
    return {} if tags is None else {"tags": list(tags)}
