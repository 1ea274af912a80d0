"""`Sample.append_response_tokens`: one generation turn (or non-trainable tool tokens) appended.

Kept apart from `slime.utils.types` so the record stays small. The contract is slime's (see
docs/plugins.md "Sample"): per-token fields stay aligned with `response_length`, top-p replay
data and routed experts from SGLang's `meta_info` are merged, the finish reason sets the status.
"""

from __future__ import annotations

from slime.utils.misc import decode_int32_meta_array

_TOP_P_IDS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSETS = ("top_p_token_offsets", "top_p_kept_token_offsets")
_FINISH_TO_STATUS = {"length": "TRUNCATED", "abort": "ABORTED", "stop": "COMPLETED"}


def _as_list(values, cast) -> list | None:
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [cast(v) for v in values]


def _checked_inputs(tokens, log_probs, trainable: bool) -> tuple[list[int], list[float]]:
    tokens = _as_list(tokens, int) or []
    log_probs = _as_list(log_probs, float)
    if log_probs is not None and len(log_probs) != len(tokens):
        raise ValueError(f"append_response_tokens: {len(log_probs)} log_probs for {len(tokens)} tokens")
    if trainable and tokens and log_probs is None:
        raise ValueError("append_response_tokens: trainable tokens need log_probs")
    if not trainable and log_probs is not None:
        raise ValueError("append_response_tokens: non-trainable tokens must not carry log_probs")
    return tokens, log_probs if log_probs is not None else [0.0] * len(tokens)


def _append_top_p(sample, meta_info: dict, n_new: int, prev_len: int) -> None:
    ids = decode_int32_meta_array(meta_info, _TOP_P_IDS)
    offsets = decode_int32_meta_array(meta_info, _TOP_P_OFFSETS)
    has_old = sample.rollout_top_p_token_offsets is not None
    if ids is None and offsets is None:
        if has_old and n_new:  # tokens without top-p data: empty spans keep offsets aligned
            old = list(sample.rollout_top_p_token_offsets)
            sample.rollout_top_p_token_offsets = old + [old[-1]] * n_new
        return
    if ids is None or offsets is None:
        raise ValueError("append_response_tokens: top-p token ids and offsets must come together")
    if len(offsets) != n_new + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
        raise ValueError(
            f"append_response_tokens: top-p offsets must start at 0, end at {len(ids)} (the id "
            f"count) and have {n_new + 1} entries; got {len(offsets)} ending at {offsets[-1] if offsets else None}"
        )
    old_ids = list(sample.rollout_top_p_token_ids or [])
    old_offsets = list(sample.rollout_top_p_token_offsets) if has_old else [0] * (prev_len + 1)
    base = old_offsets[-1]
    sample.rollout_top_p_token_ids = old_ids + ids
    sample.rollout_top_p_token_offsets = old_offsets + [base + o for o in offsets[1:]]


def append_routed_experts(sample, args, meta_info: dict) -> None:
    """Merge SGLang's `routed_experts` (rows for tokens [routed_experts_start_len, len(tokens) - 1),
    tokens already appended) into `sample.rollout_routed_experts` [rows, num_layers, topk]."""
    flat = decode_int32_meta_array(meta_info, "routed_experts")
    if flat is None:
        return
    if args is None:
        raise ValueError("append_response_tokens: routed_experts in meta_info need args (num_layers, moe_router_topk)")
    import numpy as np

    start = int(meta_info.get("routed_experts_start_len", 0) or 0)
    rows = max(len(sample.tokens) - 1 - start, 0)
    layers, topk = int(args.num_layers), int(args.moe_router_topk)
    if len(flat) != rows * layers * topk:
        raise ValueError(
            f"append_response_tokens: {len(flat)} routed experts, expected rows*layers*topk = "
            f"{rows}*{layers}*{topk}"
        )
    new = np.asarray(flat, dtype=np.int32).reshape(rows, layers, topk)
    if start == 0 or sample.rollout_routed_experts is None:
        sample.rollout_routed_experts = new
    else:
        existing = np.asarray(sample.rollout_routed_experts, dtype=np.int32)[:start]
        sample.rollout_routed_experts = np.concatenate([existing, new], axis=0)


def _apply_meta_info(sample, args, meta_info: dict, update_terminal_info: bool) -> None:
    """Counters and weight version always; the status only for terminal info (finish reason)."""
    if getattr(args, "sglang_speculative_algorithm", None):
        sample.spec_info.add(meta_info)
    sample.prefix_cache_info.add(meta_info)
    if "weight_version" in meta_info:
        sample.weight_versions.append(meta_info["weight_version"])
    if update_terminal_info and "finish_reason" in meta_info:
        reason = meta_info["finish_reason"]
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind in _FINISH_TO_STATUS:
            sample.status = type(sample).Status[_FINISH_TO_STATUS[kind]]


def _validate_response_metadata_lengths(sample) -> None:
    n = sample.response_length
    for name in ("loss_mask", "rollout_log_probs"):
        value = getattr(sample, name)
        if value is not None and len(value) != n:
            raise ValueError(f"append_response_tokens: {name} has {len(value)} entries, response_length is {n}")
    ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
    if (ids is None) != (offsets is None):
        raise ValueError("append_response_tokens: rollout_top_p_token_ids and offsets must be set together")
    if offsets is not None and (len(offsets) != n + 1 or offsets[-1] != len(ids)):
        raise ValueError(
            f"append_response_tokens: top-p offsets have {len(offsets)} entries ending at "
            f"{offsets[-1]}; expected {n + 1} ending at {len(ids)}"
        )


def append_response_tokens(
    sample, args=None, *, tokens=None, log_probs=None, trainable=True, meta_info=None, text=None,
    update_terminal_info=True,
) -> None:
    """See `Sample.append_response_tokens`."""
    tokens, log_probs = _checked_inputs(tokens, log_probs, trainable)
    meta_info = meta_info or {}
    prev_len, n = sample.response_length, len(tokens)
    if sample.rollout_log_probs is None and trainable and n and prev_len:
        raise ValueError("append_response_tokens: trainable tokens appended to a response without log-probs")
    if text:
        sample.response += text
    sample.tokens = list(sample.tokens) + tokens
    sample.response_length = prev_len + n
    mask = [1] * prev_len if sample.loss_mask is None else list(sample.loss_mask)
    sample.loss_mask = mask + [1 if trainable else 0] * n
    old_lp = [0.0] * prev_len if sample.rollout_log_probs is None else list(sample.rollout_log_probs)
    sample.rollout_log_probs = old_lp + log_probs
    _append_top_p(sample, meta_info if trainable else {}, n, prev_len)
    append_routed_experts(sample, args, meta_info)
    _apply_meta_info(sample, args, meta_info, update_terminal_info)
    _validate_response_metadata_lengths(sample)
