"""The `dapo` reward (DAPO's rule): the answer after the last "Answer:", +1 / -1.

Owns `extract_dapo_answer` and `compute_score`. The answer is the rest of the line after the last
"Answer:" (case-insensitive); a `\\boxed{}` there is unwrapped, and a response with no "Answer:"
falls back to its last `\\boxed{}`. Predictions are compared with the shared math equivalence.
"""

from __future__ import annotations

import re

from slime.rollout.rm_hub.math_utils import (
    extract_boxed_answer,
    is_equiv,
    label_candidates,
    normalize_answer,
)

_ANSWER_RE = re.compile(r"answer\s*:", re.IGNORECASE)


def extract_dapo_answer(response: str) -> str:
    """The raw predicted answer of a DAPO-style response ("" when there is none)."""
    matches = list(_ANSWER_RE.finditer(response))
    if not matches:
        return extract_boxed_answer(response) or ""
    rest = response[matches[-1].end() :].strip()
    boxed = extract_boxed_answer(rest)
    if boxed is not None:
        return boxed
    return rest.split("\n", 1)[0].strip()


def score_answer(pred: str, label) -> dict:
    """DAPO reward of an extracted answer: {"score": +1.0 / -1.0, "acc": bool, "pred": str}.

    `pred` in the result is the normalised prediction ("" when there was none).
    """
    if label is None:
        raise ValueError("rm_type 'dapo' needs sample.label (set --label-key)")
    acc = bool(pred) and any(is_equiv(pred, lab) for lab in label_candidates(label))
    shown = normalize_answer(pred) if pred else ""
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": shown}


def compute_score(response: str, label) -> dict:
    """DAPO reward of a whole response (answer after the last "Answer:", see the module doc)."""
    return score_answer(extract_dapo_answer(response), label)
