"""The `gpqa` reward: multiple choice, 1 if the chosen letter is the correct one.

Owns `choice_letters`, `label_to_letter`, `extract_choice` and `grade_gpqa`. Letters run A-D, or
over as many letters as `metadata["choices"]` has entries. The label is a letter ("C", "(C)") or
the text of the correct choice (looked up in `metadata["choices"]`). The chosen letter is read
from the part after the last `</think>`, by the first pattern family that matches (last match
within it): `\\boxed{C}`, "Answer: C" / "the answer is (C)", a parenthesised "(C)", a bare
letter, or the exact text of one choice.
"""

from __future__ import annotations

import re
import string

from slime.rollout.rm_hub.f1 import normalize_f1_text
from slime.rollout.rm_hub.math_utils import extract_boxed_answer

_DEFAULT_NUM_CHOICES = 4


def choice_letters(metadata: dict | None) -> str:
    """The valid option letters: "ABCD", or one letter per entry of metadata["choices"]."""
    choices = (metadata or {}).get("choices")
    count = len(choices) if choices else _DEFAULT_NUM_CHOICES
    if count > len(string.ascii_uppercase):
        raise ValueError(f"gpqa: metadata['choices'] has {count} entries; at most 26 supported")
    return string.ascii_uppercase[:count]


def _bare_letter(text: str, letters: str) -> str | None:
    """The letter if `text` is just one option letter, maybe wrapped: "(C)", "C.", "\\text{C}"."""
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text)
    text = text.strip().strip("*").strip()
    match = re.fullmatch(r"\(?\s*([A-Za-z])\s*\)?\s*[.:]?", text)
    if match and match.group(1).upper() in letters:
        return match.group(1).upper()
    return None


def label_to_letter(label, metadata: dict | None) -> str:
    """The correct letter from a letter label or the correct choice's text."""
    letters = choice_letters(metadata)
    letter = _bare_letter(str(label), letters)
    if letter is not None:
        return letter
    choices = (metadata or {}).get("choices") or []
    wanted = normalize_f1_text(label)
    for letter, choice in zip(letters, choices):
        if normalize_f1_text(choice) == wanted:
            return letter
    raise ValueError(
        f"gpqa: label {label!r} is neither an option letter ({letters}) nor the text of one of "
        "metadata['choices']"
    )


def _choice_patterns(letters: str) -> list[re.Pattern]:
    """Answer patterns in priority order; the letter is group 1 or 2 (parenthesised letters may
    be lower-case, bare ones must be upper-case: "answer: a" is more likely an article)."""
    upper, either = f"[{letters}]", f"[{letters}{letters.lower()}]"
    choice = rf"(?:\(\s*({either})\s*\)|({upper})(?![A-Za-z]))"
    return [
        re.compile(rf"(?i:answer)(?:\s+is)?\s*[:：]?\s*(?:\\text\{{)?\**\s*{choice}"),
        re.compile(rf"\(({either})\)()"),
    ]


def extract_choice(response: str, metadata: dict | None = None) -> str | None:
    """The option letter a response chose, or None when none can be read."""
    letters = choice_letters(metadata)
    text = response.rsplit("</think>", 1)[-1]
    boxed = extract_boxed_answer(text)
    if boxed is not None and (letter := _bare_letter(boxed, letters)) is not None:
        return letter
    for pattern in _choice_patterns(letters):
        matches = list(pattern.finditer(text))
        if matches:
            return (matches[-1].group(1) or matches[-1].group(2)).upper()
    if (letter := _bare_letter(text, letters)) is not None:
        return letter
    wanted = normalize_f1_text(boxed if boxed is not None else text)
    choices = (metadata or {}).get("choices") or []
    return next((ltr for ltr, c in zip(letters, choices) if normalize_f1_text(c) == wanted), None)


def grade_gpqa(response: str, label, metadata: dict | None) -> float:
    """The `gpqa` reward: 1.0 if the chosen letter equals the label's letter, else 0.0."""
    if label is None:
        raise ValueError("rm_type 'gpqa' needs sample.label (set --label-key)")
    correct = label_to_letter(label, metadata)
    return 1.0 if extract_choice(response, metadata) == correct else 0.0
