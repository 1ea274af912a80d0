"""Sampling parameters of one request (parsed and validated from SGLang's JSON) and batched sampling.

Owns: `SamplingParams` (the subset of SGLang's sampling fields the local engine honours, plus the
ones it accepts only at their neutral value), `parse_sampling_params` (raises `RequestError` naming
the field for any bad value) and `sample_next_tokens` (temperature / top-k / top-p / min-p sampling
of a batch with one `torch.Generator` per request, and the sampled tokens' log-probs).

Log-prob convention (what SGLang reports and the trainer compares against): the sampled token's
log-prob under `log_softmax(logits / temperature)` before any top-k / top-p / min-p filtering; for
temperature 0 (greedy) under `log_softmax(logits)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

DEFAULT_MAX_NEW_TOKENS = 128


class RequestError(ValueError):
    """A client error in a request; the server answers it with HTTP 400 and this message."""


@dataclasses.dataclass
class SamplingParams:
    """Validated per-request sampling parameters (SGLang names and meanings)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None


# SGLang sampling fields the engine accepts only at their neutral value: field -> neutral values.
_NEUTRAL_ONLY = {
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
    "repetition_penalty": (1, 1.0, None),
    "min_new_tokens": (0, None),
    "n": (1, None),
    "json_schema": (None,),
    "regex": (None,),
    "ebnf": (None,),
    "structural_tag": (None,),
    "stop_regex": (None, [], ""),
    "logit_bias": (None, {}),
    "custom_params": (None, {}),
}
# SGLang fields with no effect on a non-streaming local engine.
_IGNORED = {"stream_interval"}


def _number(d: dict, name: str, default, kind):
    value = d.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"sampling_params.{name} must be a number, got {value!r}")
    if kind is int:
        if float(value) != int(value):
            raise RequestError(f"sampling_params.{name} must be an integer, got {value!r}")
        return int(value)
    return float(value)


def _check_ranges(p: SamplingParams) -> None:
    if p.max_new_tokens < 0:
        raise RequestError(f"sampling_params.max_new_tokens must be >= 0, got {p.max_new_tokens}")
    if p.temperature < 0:
        raise RequestError(f"sampling_params.temperature must be >= 0, got {p.temperature}")
    if not 0.0 < p.top_p <= 1.0:
        raise RequestError(f"sampling_params.top_p must be in (0, 1], got {p.top_p}")
    if p.top_k == 0 or p.top_k < -1:
        raise RequestError(f"sampling_params.top_k must be -1 (disabled) or >= 1, got {p.top_k}")
    if not 0.0 <= p.min_p <= 1.0:
        raise RequestError(f"sampling_params.min_p must be in [0, 1], got {p.min_p}")


def _string_list(value: Any, name: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [v for v in value if v]
    raise RequestError(f"sampling_params.{name} must be a string or a list of strings, got {value!r}")


def _int_list(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise RequestError(f"sampling_params.{name} must be a list of token ids, got {value!r}")


def parse_sampling_params(raw: Any, prompt_len: int, context_length: int) -> SamplingParams:
    """Validate SGLang `sampling_params` (dict or None) for a prompt of `prompt_len` tokens.

    Raises `RequestError` naming the offending field for bad values, unknown fields, features the
    engine does not implement (non-neutral penalties, grammars, ...) and prompts that do not fit:
    `prompt_len + max_new_tokens > context_length`. Without `max_new_tokens` the default (128) is
    capped to the room left in the context.
    """
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise RequestError(f"sampling_params must be an object, got {type(raw).__name__}")
    known = {f.name for f in dataclasses.fields(SamplingParams)} | set(_NEUTRAL_ONLY) | _IGNORED
    for name, value in raw.items():
        if name not in known:
            raise RequestError(f"sampling_params.{name} is not a known SGLang sampling parameter")
        if name in _NEUTRAL_ONLY and value not in _NEUTRAL_ONLY[name]:
            raise RequestError(f"sampling_params.{name}={value!r} is not supported by the local engine")
    p = SamplingParams(
        max_new_tokens=_number(raw, "max_new_tokens", None, int),
        temperature=_number(raw, "temperature", 1.0, float),
        top_p=_number(raw, "top_p", 1.0, float),
        top_k=_number(raw, "top_k", -1, int),
        min_p=_number(raw, "min_p", 0.0, float),
        stop=_string_list(raw.get("stop"), "stop"),
        stop_token_ids=_int_list(raw.get("stop_token_ids"), "stop_token_ids"),
        ignore_eos=bool(raw.get("ignore_eos", False)),
        skip_special_tokens=bool(raw.get("skip_special_tokens", True)),
        spaces_between_special_tokens=bool(raw.get("spaces_between_special_tokens", True)),
        no_stop_trim=bool(raw.get("no_stop_trim", False)),
        sampling_seed=_number(raw, "sampling_seed", None, int),
    )
    if p.top_k > 1 << 30:  # SGLang's "disabled" sentinel for top_k
        p.top_k = -1
    if p.max_new_tokens is None:
        p.max_new_tokens = max(0, min(DEFAULT_MAX_NEW_TOKENS, context_length - prompt_len))
    _check_ranges(p)
    if prompt_len + p.max_new_tokens > context_length:
        raise RequestError(
            f"prompt ({prompt_len} tokens) + sampling_params.max_new_tokens ({p.max_new_tokens}) exceeds "
            f"the context length {context_length} (--context-length)"
        )
    return p


def _filter_probs(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Zero out the probabilities top-k / top-p / min-p remove from one row `probs` [V]."""
    sorted_probs, order = probs.sort(descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if p.top_k > 0:
        keep[p.top_k :] = False
    if p.top_p < 1.0:
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        keep &= (sorted_probs.cumsum(0) - sorted_probs) < p.top_p
    if p.min_p > 0.0:
        keep &= sorted_probs >= p.min_p * sorted_probs[0]
    keep[0] = True
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = sorted_probs[keep]
    return filtered


def sample_next_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Sample one token per row of `logits` [B, V] (any float dtype) with that row's params.

    Returns (token ids [B], log-probs [B]) with the log-prob convention of the module docstring.
    Rows with temperature 0 take the argmax; others draw from the filtered, renormalised
    softmax(logits / T) with their own generator (so seeded requests are reproducible whatever
    else is in the batch).
    """
    logits = logits.float()
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    if any(t != 1.0 for t in temps):  # dividing by 1.0 changes no bit: skipped for greedy / T=1 batches
        logits = logits / torch.tensor(temps, dtype=torch.float32, device=logits.device)[:, None]
    logprobs = torch.log_softmax(logits, dim=-1).cpu()
    chosen = logprobs.argmax(dim=-1).tolist()  # greedy rows keep this; sampled rows are overwritten below
    for row, (p, gen) in enumerate(zip(params, generators)):
        if p.temperature > 0:
            probs = logprobs[row].exp()
            if p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0:  # no filter: the same probs, unsorted
                probs = _filter_probs(probs, p)
            chosen[row] = int(torch.multinomial(probs, 1, generator=gen))
    return chosen, logprobs.gather(1, torch.tensor(chosen)[:, None])[:, 0].tolist()
