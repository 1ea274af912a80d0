"""The SGLang teacher of on-policy distillation (`--use-opd --opd-type sglang`): the teacher's
per-token log-probs of a finished sample's response, into `Sample.teacher_log_probs`.

The teacher is any server speaking SGLang's `/generate` (an SGLang server or our local engine)
at `--opd-teacher-url`. The request feeds prompt + response as the prompt with
`max_new_tokens` 0, `return_logprob` and `logprob_start_len` just before the response, so the
answer's `meta_info.input_token_logprobs` holds one `[logprob, token_id, text]` entry per fed
token from that position on, the first with logprob None (SGLang scores only the positions after
`logprob_start_len`; the local engine does the same). The last `response_length` entries are the
response's, checked token by token against the sample.
"""

from __future__ import annotations

import logging

from slime.utils import engine_requests
from slime.utils.engine_client import EngineClient
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

# The teacher's distribution itself (no temperature scaling on either engine's side).
TEACHER_TEMPERATURE = 1.0


def teacher_request(sample: Sample) -> dict:
    """The `/generate` body asking for the teacher's log-probs of `sample`'s response tokens.
    `logprob_start_len` is one before the response (SGLang requires it below the fed length)."""
    start = max(len(sample.tokens) - sample.response_length - 1, 0)
    body = engine_requests.generate(list(sample.tokens), {"max_new_tokens": 0, "temperature": TEACHER_TEMPERATURE},
                                    return_logprob=True)
    body["logprob_start_len"] = start
    return body


def teacher_log_probs_from_output(output: dict, sample: Sample) -> list[float]:
    """The teacher's log-prob of each of `sample`'s response tokens from its `/generate` answer
    ([response_length] floats). Raises ValueError naming the sample when entries are missing,
    None, or carry other token ids than the response (a misaligned answer)."""
    entries = output.get("meta_info", {}).get("input_token_logprobs")
    n = sample.response_length
    if entries is None or len(entries) < n:
        got = "no input_token_logprobs" if entries is None else f"{len(entries)} input_token_logprobs"
        raise ValueError(f"--opd-teacher-url answered {got} for sample {sample.index} with {n} response tokens")
    entries = entries[len(entries) - n:]
    response = list(sample.tokens[len(sample.tokens) - n:])
    ids = [int(e[1]) for e in entries]
    if ids != response:
        raise ValueError(f"--opd-teacher-url: the teacher scored tokens {ids[:8]} but sample {sample.index}'s response "
                         f"is {response[:8]} (misaligned input_token_logprobs)")
    if any(e[0] is None for e in entries):
        raise ValueError(f"--opd-teacher-url: a response token of sample {sample.index} got no log-prob")
    return [float(e[0]) for e in entries]


def needs_teacher(args, sample: Sample, evaluation: bool) -> bool:
    """Whether `sample` gets the teacher's log-probs: train samples of a `--use-opd --opd-type
    sglang` run that finished (aborted ones are continued or dropped, never trained on)."""
    return (getattr(args, "use_opd", False) and args.opd_type == "sglang" and not evaluation
            and sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED))


async def fetch_teacher_log_probs(args, sample: Sample, client: EngineClient | None = None) -> Sample:
    """Set `sample.teacher_log_probs` from the teacher at `--opd-teacher-url` (an empty response
    gets an empty list without a request). `client`: a client of that URL to reuse."""
    if sample.response_length == 0:
        sample.teacher_log_probs = []
        return sample
    if client is None:
        async with EngineClient(args.opd_teacher_url) as own:
            return await fetch_teacher_log_probs(args, sample, own)
    output = await client.generate(teacher_request(sample))
    sample.teacher_log_probs = teacher_log_probs_from_output(output, sample)
    return sample
