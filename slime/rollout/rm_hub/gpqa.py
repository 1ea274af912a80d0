"""The `gpqa` reward: multiple choice, 1 if the chosen letter is the correct one.

Owns `choice_letters`, `label_to_letter`, `extract_choice` and `grade_gpqa` (slime's name:
`compute_gpqa_reward`). Letters are `metadata["valid_letters"]`, else one per entry of
`metadata["choices"]`, else A-J (`DEFAULT_VALID_LETTERS`, as slime). The correct letter is
`metadata["correct_letter"]`, else the label: a letter ("C", "(C)"), a 0-based index (3, "3"), or
the text of the correct choice (also `metadata["correct_answer"]` / `["answer_text"]`). The chosen letter is read
from the part after the last `</think>`, by the first pattern family that matches (last match
within it): `\\boxed{C}`, "Answer: C" / "the answer is (C)", a parenthesised "(C)", a bare
letter, or the exact text of one choice.
"""

from __future__ import annotations

import re
import string

from slime.rollout.rm_hub.f1 import normalize_f1_text
from slime.rollout.rm_hub.math_utils import extract_boxed_answer

DEFAULT_VALID_LETTERS = "ABCDEFGHIJ"


def choice_letters(metadata: dict | None) -> str:
    """The valid option letters: metadata["valid_letters"], one per metadata["choices"], or A-J."""
    valid = (metadata or {}).get("valid_letters")
    if valid:
        return "".join(str(v).strip().upper() for v in valid)
    choices = (metadata or {}).get("choices")
    if not choices:
        return DEFAULT_VALID_LETTERS
    count = len(choices)
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
    """The correct letter: metadata["correct_letter"], or from the label (letter, 0-based index, or
    the correct choice's text, which metadata["correct_answer"] / ["answer_text"] may also give)."""
    metadata = metadata or {}
    letters = choice_letters(metadata)
    for given in (metadata.get("correct_letter"), label):
        letter = _bare_letter(str(given), letters) if given is not None else None
        if letter is not None:
            return letter
    if isinstance(label, int) or (isinstance(label, str) and label.strip().isdigit()):
        index = int(label)
        if 0 <= index < len(letters):
            return letters[index]
    choices = metadata.get("choices") or []
    for text in (metadata.get("correct_answer"), metadata.get("answer_text"), label):
        wanted = normalize_f1_text(text) if text is not None else None
        for letter, choice in zip(letters, choices):
            if wanted and normalize_f1_text(choice) == wanted:
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


def compute_gpqa_reward(response: str, label, metadata: dict | None = None) -> float:
    """slime's name for the `gpqa` grader (see `grade_gpqa`)."""
    return grade_gpqa(response, label, metadata)
