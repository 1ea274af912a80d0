"""The `char_match` reward: partial credit per character, and for stopping right after the answer.

Made for short exact answers learnt from scratch (the `odd_even` toy task of
tools/make_toy_data.py): an exact-match reward on a multi-token answer is zero for almost every
sample of a random model, so GRPO gets no signal. Here each position of the response that equals
the label's character at that position earns a share, and so does ending the turn (the engine
stopped on an end-of-turn token, `Sample.Status.COMPLETED`) right after as many characters as the
label has. The exact answer followed by the end of turn scores 1.0; a random model scores about
1/vocab.

Lengths also count response tokens (`num_tokens`, the answer's tokens without the end of turn):
token ids that decode to nothing (a tokenizer's unused embedding rows, 25 of the tiny model's
128) would otherwise make "11" + an invisible token look like the exact answer cut short (2/3)
rather than three tokens of which one is wrong (2/4). The GRPO loop found that hole and stayed
in it instead of learning to stop.
"""

from __future__ import annotations


def char_match_score(text: str, label: str, stopped: bool | None, num_tokens: int | None = None) -> float:
    """Score in [0, 1]: (matching positions + [stopped right after the answer]) / positions.

    positions = max(len(text), len(label), num_tokens) + 1, the last one for the stop, which
    counts when the response has len(label) characters (and num_tokens == len(label) when given).
    `stopped=None` leaves the stop out (positions = max(len(text), len(label), num_tokens), at least 1).
    """
    label = str(label)
    hits = sum(a == b for a, b in zip(text, label))
    positions = max(len(text), len(label), num_tokens or 0)
    if stopped is not None:
        hits += bool(stopped) and len(text) == len(label) and num_tokens in (None, len(label))
        positions += 1
    return hits / max(positions, 1)
