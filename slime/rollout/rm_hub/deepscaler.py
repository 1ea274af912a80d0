"""The `deepscaler` reward: a boxed final answer written after the reasoning block.

Owns `get_deepscaler_rule_based_reward`. The answer must come after the last `</think>` (or
`###Response`); a response without either, or without a `\\boxed{}` there, scores 0.
"""

from __future__ import annotations

from slime.rollout.rm_hub.math_utils import extract_boxed_answer, grade_answer

_ANSWER_MARKERS = ("</think>", "###Response")


def get_deepscaler_rule_based_reward(response: str, label) -> int:
    """1 if the last boxed answer after the reasoning marker equals `label` (or any of a list
    of labels) by normalised string or sympy equality, else 0 (an int, as in slime)."""
    if label is None:
        raise ValueError("rm_type 'deepscaler' needs sample.label (set --label-key)")
    marker = next((m for m in _ANSWER_MARKERS if m in response), None)
    if marker is None:
        return 0
    answer = extract_boxed_answer(response.rsplit(marker, 1)[1])
    if answer is None:
        return 0
    return int(grade_answer(answer, label))
