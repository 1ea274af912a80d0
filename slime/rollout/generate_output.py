"""What one `/generate` request may ask for and what its answer does to the sample: shared by the
per-sample request (`sglang_rollout.generate`) and the group's batched one (`group_requests.py`),
so both paths leave a sample in exactly the same state."""

from __future__ import annotations

from slime.utils.types import Sample


def response_budget(args, sample: Sample, max_new_tokens: int) -> int:
    """New tokens this request may generate: what is left of ``max_new_tokens`` after the response
    so far (a partial rollout continues), cut so that prompt + response fit
    ``--rollout-max-context-len`` when it is set (slime: ``min(max_new_tokens, context - len(tokens))``).
    <= 0 means the sample is already at a limit (it is marked truncated, nothing is sent)."""
    budget = max_new_tokens - sample.response_length
    context = getattr(args, "rollout_max_context_len", None)
    if context is not None:
        budget = min(budget, context - len(sample.tokens))
    return budget


def apply_generate_output(args, sample: Sample, output: dict, routed_experts: bool = False) -> Sample:
    """Append one `/generate` result (one prompt's) to `sample` as slime does: tokens, text,
    log-probs, a loss mask of 1s, the weight version when the engine sends one, the status from
    SGLang's finish reason (an unknown reason raises). With `routed_experts` the answer's routing
    covers the whole sequence and replaces an earlier turn's."""
    meta = output["meta_info"]
    Sample.status_from_finish_reason(meta["finish_reason"]["type"])  # an unknown reason raises
    if routed_experts:
        sample.rollout_routed_experts = None
    pairs = meta["output_token_logprobs"]
    sample.append_response_tokens(args, tokens=[int(p[1]) for p in pairs], log_probs=[float(p[0]) for p in pairs],
                                  text=output["text"], meta_info=meta)
    return sample
