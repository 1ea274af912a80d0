"""The `char_match` reward: for a finished response, a share per answer position and one for
stopping right after the answer; a response cut at the length limit scores 0.

Made for short exact answers learnt from scratch (the `parity_twice` toy task of
tools/make_toy_data.py): an exact-match reward on a multi-token answer is zero for almost every
sample of a random model, so GRPO gets no signal. Here the target is the label's characters
followed by the end of turn, and a response that ended its turn (the engine stopped on an
end-of-turn token, `Sample.Status.COMPLETED`) scores the fraction of target positions it gets
right: each label character equal to the response's character at that position earns a share,
and so does ending right after as many characters as the label has. The exact answer followed by
the end of turn scores 1.0; a random model scores about 1/vocab of that (it must first sample
the end of turn).

A response cut at the length limit scores 0: it gave no answer. When cut responses earned their
characters' shares, GRPO on `parity_twice` learnt the characters first ("000" / "111", cut), the
policy's entropy collapsed before the end of turn was found and it stayed there (README, "The
multi-token task"); scoring only finished responses makes the stop the first thing learnt,
while the characters' entropy is still high.

The response text must not hold the end-of-turn token's text (`--rollout-skip-special-tokens`,
checked at start-up): otherwise a stopped response is longer than the answer and the stop never
counts. Lengths also count response tokens (`num_tokens`, the answer's tokens without the end of
turn) for the stop's share: token ids that decode to nothing (a tokenizer's unused embedding
rows, 25 of the tiny model's 128) must not make "11" + an invisible token + end of turn look
like the exact answer. The GRPO loop found such a hole once and stayed in it.
"""

from __future__ import annotations


def char_match_score(text: str, label: str, stopped: bool | None, num_tokens: int | None = None) -> float:
    """Score in [0, 1]: (label positions matched + [stopped right after the answer]) / (len(label) + 1).

    The stop counts when the response has len(label) characters (and num_tokens == len(label)
    when given). `stopped=False` (cut at the length limit) scores 0. `stopped=None` leaves the
    stop out: matched positions / len(label) (at least 1).
    """
    if stopped is False:
        return 0.0
    label = str(label)
    hits = sum(a == b for a, b in zip(text, label))
    positions = len(label)
    if stopped is not None:
        hits += bool(stopped) and len(text) == len(label) and num_tokens in (None, len(label))
        positions += 1
    return hits / max(positions, 1)
