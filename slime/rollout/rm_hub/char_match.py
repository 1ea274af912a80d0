"""The `char_match` reward: partial credit per character, and for stopping right after the answer.

Made for short exact answers learnt from scratch (the `odd_even` toy task of
tools/make_toy_data.py): an exact-match reward on a multi-token answer is zero for almost every
sample of a random model, so GRPO gets no signal. Here each position of the response that equals
the label's character at that position earns a share, and so does ending the turn (the engine
stopped on an end-of-turn token, `Sample.Status.COMPLETED`) right after as many characters as the
label has. The exact answer followed by the end of turn scores 1.0; a random model scores about
1/vocab.
"""

from __future__ import annotations


def char_match_score(text: str, label: str, stopped: bool | None) -> float:
    """Score in [0, 1]: (matching positions + [stopped after len(label) characters]) / positions.

    positions = max(len(text), len(label)) + 1, the last one for the stop. `stopped=None` leaves
    the stop out (positions = max(len(text), len(label)), at least 1).
    """
    label = str(label)
    hits = sum(a == b for a, b in zip(text, label))
    positions = max(len(text), len(label))
    if stopped is not None:
        hits += bool(stopped) and len(text) == len(label)
        positions += 1
    return hits / max(positions, 1)
