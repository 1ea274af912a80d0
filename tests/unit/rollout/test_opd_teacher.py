"""The SGLang teacher of on-policy distillation: the `/generate` body it sends and how the answer's
`input_token_logprobs` become `Sample.teacher_log_probs` (aligned with the response, checked)."""

import pytest

from slime.rollout.opd_teacher import needs_teacher, teacher_log_probs_from_output, teacher_request
from slime.utils.types import Sample


def _sample(prompt, response, status=Sample.Status.COMPLETED):
    return Sample(index=3, tokens=prompt + response, response_length=len(response), status=status)


def test_request_scores_prompt_plus_response_from_just_before_the_response():
    body = teacher_request(_sample([5, 6, 7], [8, 9]))
    assert body["input_ids"] == [5, 6, 7, 8, 9]
    assert body["sampling_params"] == {"max_new_tokens": 0, "temperature": 1.0}
    assert body["return_logprob"] is True and body["logprob_start_len"] == 2


def test_response_log_probs_are_the_last_entries_in_order():
    sample = _sample([5, 6, 7], [8, 9])
    # logprob_start_len 2: entries for positions 2, 3, 4 (tokens 7, 8, 9); SGLang leaves the first None
    output = {"meta_info": {"input_token_logprobs": [[None, 7, None], [-1.5, 8, None], [-0.25, 9, None]]}}
    assert teacher_log_probs_from_output(output, sample) == [-1.5, -0.25]


def test_a_one_token_prompt_still_aligns():
    sample = _sample([5], [8])
    body = teacher_request(sample)
    assert body["logprob_start_len"] == 0
    output = {"meta_info": {"input_token_logprobs": [[None, 5, None], [-2.0, 8, None]]}}
    assert teacher_log_probs_from_output(output, sample) == [-2.0]


@pytest.mark.parametrize("entries,match", [
    (None, "no input_token_logprobs"),
    ([[-1.0, 9, None]], "1 input_token_logprobs for sample 3 with 2 response tokens"),
    ([[-1.0, 8, None], [-1.0, 4, None]], "misaligned"),
    ([[None, 8, None], [-1.0, 9, None]], "got no log-prob"),
])
def test_bad_answers_are_refused_naming_the_sample(entries, match):
    meta = {} if entries is None else {"input_token_logprobs": entries}
    with pytest.raises(ValueError, match=match):
        teacher_log_probs_from_output({"meta_info": meta}, _sample([5, 6, 7], [8, 9]))


class _Args:
    use_opd, opd_type = True, "sglang"


@pytest.mark.parametrize("status,evaluation,opd_type,want", [
    (Sample.Status.COMPLETED, False, "sglang", True),
    (Sample.Status.TRUNCATED, False, "sglang", True),
    (Sample.Status.ABORTED, False, "sglang", False),
    (Sample.Status.COMPLETED, True, "sglang", False),
    (Sample.Status.COMPLETED, False, "megatron", False),
])
def test_which_samples_ask_the_teacher(status, evaluation, opd_type, want):
    args = _Args()
    args.opd_type = opd_type
    assert needs_teacher(args, _sample([1], [2], status), evaluation) is want
