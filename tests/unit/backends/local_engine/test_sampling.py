"""Sampling parameter validation and the top-k / top-p / min-p filter, without a server."""

import pytest
import torch

from slime.backends.local_engine.sampling import (
    RequestError,
    SamplingParams,
    _filter_probs,
    parse_sampling_params,
    sample_next_tokens,
)


def test_defaults_and_context_cap():
    p = parse_sampling_params(None, prompt_len=10, context_length=64)
    assert (p.temperature, p.top_p, p.top_k, p.max_new_tokens) == (1.0, 1.0, -1, 54)
    assert parse_sampling_params({"stop": "x", "top_k": 1 << 31}, 1, 512).stop == ["x"]
    assert parse_sampling_params({"stop": "x", "top_k": 1 << 31}, 1, 512).top_k == -1


@pytest.mark.parametrize("raw,field", [
    ({"max_new_tokens": -1}, "max_new_tokens"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_k": 0}, "top_k"), ({"min_p": 2}, "min_p"), ({"stop": 3}, "stop"), ({"stop_token_ids": "a"}, "stop_token_ids"),
    ({"max_new_tokens": 1.5}, "max_new_tokens"), ({"temperature": "hot"}, "temperature"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"), ({"bogus": 1}, "bogus"), ({"max_new_tokens": 60}, "context"),
])
def test_bad_values_name_the_field(raw, field):
    with pytest.raises(RequestError, match=field):
        parse_sampling_params(raw, prompt_len=10, context_length=64)


def test_filters_keep_the_right_tokens():
    probs = torch.tensor([0.1, 0.4, 0.3, 0.2])
    assert _filter_probs(probs, SamplingParams(top_k=2)).nonzero().flatten().tolist() == [1, 2]
    # top_p 0.75: 0.4 + 0.3 = 0.7 < 0.75, so the 0.2 token is still needed
    assert _filter_probs(probs, SamplingParams(top_p=0.75)).nonzero().flatten().tolist() == [1, 2, 3]
    assert _filter_probs(probs, SamplingParams(top_p=0.7)).nonzero().flatten().tolist() == [1, 2]
    assert _filter_probs(probs, SamplingParams(min_p=0.6)).nonzero().flatten().tolist() == [1, 2]
    assert _filter_probs(probs, SamplingParams(top_p=0.01)).nonzero().flatten().tolist() == [1]


def test_greedy_and_logprob_convention():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.5, top_k=1)]
    gens = [torch.Generator().manual_seed(0) for _ in params]
    tokens, logprobs = sample_next_tokens(logits, params, gens)
    assert tokens == [1, 0]
    assert logprobs[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[1]))
    # the logprob is under softmax(logits / T) before the top-k filter
    assert logprobs[1] == pytest.approx(float(torch.log_softmax(logits[1] / 0.5, -1)[0]))


def test_unfiltered_rows_draw_what_the_filtered_path_draws():
    """Rows without top-k / top-p / min-p skip the (identity) filter: same draws, same seeds."""
    from slime.backends.local_engine.sampling import SamplingParams, _filter_probs, sample_next_tokens

    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.7)] * 6
    got, _ = sample_next_tokens(logits, params, [torch.Generator().manual_seed(s) for s in range(6)])
    probs = torch.log_softmax(logits / 0.7, dim=-1).exp()
    want = [int(torch.multinomial(_filter_probs(probs[r], params[r]), 1, generator=torch.Generator().manual_seed(r))[0])
            for r in range(6)]
    assert got == want
