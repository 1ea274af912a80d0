"""The `char_match` reward: a share per label position plus one for the stop, 0 when cut; hand-computed."""

import asyncio
from types import SimpleNamespace

import pytest

from slime.rollout.rm_hub import async_rm
from slime.rollout.rm_hub.char_match import char_match_score
from slime.utils.types import Sample


@pytest.mark.parametrize(
    "text, label, stopped, expected",
    [
        ("odd", "odd", True, 1.0),  # exact word, then end of turn
        ("odd", "odd", False, 0.0),  # cut at the length limit: no answer, whatever its characters
        ("odd", "even", True, 0 / 5),  # o/e d/v d/e, missing n, stopped too early
        ("evex", "even", True, 4 / 5),  # wrong last character; the stop at position 5 still counts
        ("eveneven", "even", True, 4 / 5),  # rambling past the answer loses the stop's share
        ("", "odd", True, 0.0),  # stopped at once
        ("000", "00", False, 0.0),  # parity_twice: the characters, cut before the stop
        ("00<|im_end|>", "00", True, 2 / 3),  # the end of turn's text kept: the stop does not count
        ("ev", "even", True, 2 / 5),
        ("odd", "odd", None, 1.0),  # stop left out (boxed_)
        ("od", "odd", None, 2 / 3),
    ],
)
def test_score(text, label, stopped, expected):
    assert char_match_score(text, label, stopped) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text, stopped, num_tokens, expected",
    [
        ("11", True, 2, 1.0),
        ("11", False, 3, 0.0),  # "11" + a token that decodes to nothing, cut
        ("11", True, 3, 2 / 3),  # ... and stopping after it is not stopping after the answer
        ("1", True, 2, 1 / 3),
    ],
)
def test_invisible_tokens_count(text, stopped, num_tokens, expected):
    assert char_match_score(text, "11", stopped, num_tokens) == pytest.approx(expected)


def test_registered_reward_reads_the_stop_from_the_sample_status():
    args = SimpleNamespace(rm_type="char_match", custom_rm_path=None, group_rm=False, rm_url=None, reward_key=None)

    def reward(status):
        return asyncio.run(async_rm(args, Sample(response="even", label="even", status=status)))

    assert reward(Sample.Status.COMPLETED) == 1.0
    assert reward(Sample.Status.TRUNCATED) == 0.0
    # 4 visible answer tokens, 1 that decodes to nothing, then the end of turn: not the exact answer
    invisible = Sample(response="even", label="even", status=Sample.Status.COMPLETED, response_length=6)
    assert asyncio.run(async_rm(args, invisible)) == pytest.approx(4 / 5)
