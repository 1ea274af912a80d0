"""The `f1` reward: SQuAD-style token-level F1 between the response and the label.

Owns `normalize_f1_text`, `f1_score` and `grade_f1`. Normalisation lower-cases, removes
punctuation and the articles a/an/the, and collapses whitespace before splitting into tokens.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from slime.rollout.rm_hub.math_utils import label_candidates

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_f1_text(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


normalize_answer = normalize_f1_text  # slime's name
_YES_NO = frozenset({"yes", "no", "noanswer"})


def f1_score(prediction: str, ground_truth: str) -> tuple[float, float, float]:
    """(f1, precision, recall) over normalised tokens, counting repeated tokens with multiplicity.

    Zero overlap (including an empty side) and a None prediction give (0.0, 0.0, 0.0); as in
    slime, when either side normalises to yes / no / noanswer they must be equal to score.
    """
    if prediction is None:
        return 0.0, 0.0, 0.0
    norm_pred, norm_gold = normalize_f1_text(prediction), normalize_f1_text(ground_truth)
    if (norm_pred in _YES_NO or norm_gold in _YES_NO) and norm_pred != norm_gold:
        return 0.0, 0.0, 0.0
    pred_tokens = normalize_f1_text(prediction).split()
    gold_tokens = normalize_f1_text(ground_truth).split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def grade_f1(response: str, label) -> float:
    """The `f1` reward: best F1 of the response against the label (or a list of labels)."""
    if label is None:
        raise ValueError("rm_type 'f1' needs sample.label (set --label-key)")
    return max(f1_score(response, str(lab))[0] for lab in label_candidates(label))
