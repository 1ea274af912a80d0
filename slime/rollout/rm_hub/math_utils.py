"""Math answer handling shared by the math graders: boxed extraction, normalisation, equivalence.

Owns `last_boxed_only_string`, `extract_boxed_answer`, `normalize_answer`, `is_equiv` and the
`math` reward (`grade_math`). Normalisation makes common equivalent spellings identical (LaTeX
wrappers, units, thousands separators, percent and degree signs, `x = 3`, trailing `.0`); what
string normalisation cannot settle (`\\frac{1}{2}` vs `0.5`, `2\\sqrt{2}` vs `\\sqrt{8}`) goes to
the bounded sympy comparison in `latex_sympy`. Tuples and intervals compare element-wise.
"""

from __future__ import annotations

import re

from slime.rollout.rm_hub.latex_sympy import parse_latex_expr, sympy_equal

MAX_ANSWER_CHARS = 400
_BOXED_COMMANDS = ("\\boxed", "\\fbox")
_UNWRAP_COMMANDS = tuple(
    "text textbf textit textrm textnormal mathrm mathbf mathit mbox operatorname".split()
)
_DROP_TOKENS = (
    "\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\quad", "\\qquad",
    "^{\\circ}", "^\\circ", "\\circ", "°", "\\%", "%", "\\$", "$", "\\(", "\\)", "\\[", "\\]",
)
# Unit words dropped from the end of an answer that starts with a quantity ("10 cm", "5 dollars").
_UNITS = frozenset(
    "cm mm km m meter meters metre metres centimeter centimeters kilometer kilometers inch inches "
    "in ft foot feet yard yards mile miles mph kg g gram grams kilogram kilograms lb lbs pound "
    "pounds ounce ounces oz l liter liters litre litres ml s sec second seconds min minute minutes "
    "h hr hour hours day days week weeks month months year years dollar dollars cent cents units "
    "unit degree degrees deg radian radians square sq cubic people students times percent".split()
)
_UNIT_TAIL_RE = re.compile(r"^(?P<head>.*?[\d})\].])\s*(?P<unit>[a-zA-Z]+)(?:\^\{?[23]\}?)?$")
_THOUSANDS_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_ASSIGNMENT_RE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?P<rhs>[^=]+)$")
_DECIMAL_RE = re.compile(r"-?\d*\.\d+|-?\d+\.")
_INTEGER_RE = re.compile(r"-?[0-9]+")


def _balanced_group(text: str, start: int) -> tuple[str, int] | None:
    """Content of the `{...}` group opening at text[start] and the index after it (None if open)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i], i + 1
    return None


def last_boxed_only_string(text: str) -> str | None:
    """The last `\\boxed{...}` / `\\fbox{...}` (or `\\boxed 5`) in `text`, wrapper included."""
    start = max(text.rfind(cmd) for cmd in _BOXED_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOXED_COMMANDS if text.startswith(c, start))
    i = start + len(cmd)
    if text.startswith(" ", i):  # "\boxed 5": the argument runs to the next space or '$'
        match = re.match(r" +([^\s$]+)", text[i:])
        return f"{cmd} {match.group(1)}" if match else None
    if not text.startswith("{", i):
        return None
    group = _balanced_group(text, i)
    return None if group is None else text[start : group[1]]


def extract_boxed_answer(text: str) -> str | None:
    """Content of the last `\\boxed{}` / `\\fbox{}` in `text` (balanced braces); None if absent."""
    boxed = last_boxed_only_string(text)
    if boxed is None:
        return None
    cmd = next(c for c in _BOXED_COMMANDS if boxed.startswith(c))
    rest = boxed[len(cmd) :]
    return rest.strip() if rest.startswith(" ") else rest[1:-1]


def _unwrap(s: str, command: str) -> str:
    """Replace every `\\command{X}` with X (balanced braces)."""
    token = "\\" + command + "{"
    while (start := s.find(token)) >= 0:
        group = _balanced_group(s, start + len(token) - 1)
        if group is None:
            return s
        s = s[:start] + group[0] + s[group[1] :]
    return s


def _strip_units(s: str) -> str:
    """Drop trailing unit words after a quantity; single-letter units only after a space."""
    while match := _UNIT_TAIL_RE.match(s):
        unit, head = match.group("unit"), match.group("head")
        spaced = s[len(head) : len(head) + 1] == " "
        if unit.lower() not in _UNITS or (len(unit) == 1 and not spaced):
            break
        s = head.strip()
    return s


def _canonical_decimal(s: str) -> str:
    """`3.0` -> `3`, `0.50` -> `0.5`, `.5` -> `0.5` (only when the whole answer is a decimal)."""
    if not _DECIMAL_RE.fullmatch(s):
        return s
    sign, body = ("-", s[1:]) if s.startswith("-") else ("", s)
    whole, _, frac = body.partition(".")
    frac = frac.rstrip("0")
    return sign + (whole or "0") + ("." + frac if frac else "")


def _short_latex_args(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\sqrt2` -> `\\sqrt{2}`, `\\dfrac` / `\\tfrac` -> `\\frac`."""
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\sqrt(?![a-zA-Z])\s*([0-9a-zA-Z])", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac(?![a-zA-Z])\s*([0-9a-zA-Z])\s*([0-9a-zA-Z])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(?![a-zA-Z])\s*([0-9a-zA-Z])\s*\{", r"\\frac{\1}{", s)
    return re.sub(r"\\frac\{([^{}]*)\}\s*([0-9a-zA-Z])", r"\\frac{\1}{\2}", s)


def _between_letters(match: re.Match) -> bool:
    """Whether a whitespace match sits between two ASCII letters."""
    text, start, end = match.string, match.start(), match.end()
    pair = text[start - 1 : start] + text[end : end + 1]
    return len(pair) == 2 and pair.isascii() and pair.isalpha()


def normalize_answer(answer) -> str:
    """Canonical string form of a final answer (see the module docstring for what it folds).

    Non-string answers are converted with str(); answers longer than MAX_ANSWER_CHARS are only
    stripped (they are compared as raw strings).
    """
    s = str(answer).strip()
    if len(s) > MAX_ANSWER_CHARS:
        return s
    boxed = extract_boxed_answer(s)
    s = boxed if boxed is not None else s
    for command in _UNWRAP_COMMANDS:
        s = _unwrap(s, command)
    for token in _DROP_TOKENS:
        s = s.replace(token, "")
    s = s.replace("{,}", ",").replace("\\ ", " ").replace("\\{", "{").replace("\\}", "}")
    s = s.strip().rstrip(".").strip()
    if match := _ASSIGNMENT_RE.match(s):
        s = match.group("rhs").strip()
    s = _strip_units(s)
    s = _short_latex_args(s)
    # Drop whitespace, except one space between letters: "\\sin x" must not become "\\sinx".
    s = re.sub(r"\s+", lambda m: " " if _between_letters(m) else "", s)
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    return _canonical_decimal(s)


def _split_top_level(s: str) -> list[str]:
    """Split on commas that are not inside (), [] or {}."""
    parts, depth, current = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _as_collection(s: str) -> tuple[str, list[str]] | None:
    """(brackets, elements) for a tuple / interval / comma list of 2+ elements, else None.

    `brackets` is e.g. "()" or "[)" when one bracket pair encloses the whole answer, else "".
    """
    brackets, inner = "", s
    if len(s) >= 2 and s[0] in "([{" and s[-1] in ")]}" and _outer_pair_encloses_all(s):
        brackets, inner = s[0] + s[-1], s[1:-1]
    parts = _split_top_level(inner)
    return (brackets, parts) if len(parts) > 1 else None


def _outer_pair_encloses_all(s: str) -> bool:
    """Whether the bracket opened at s[0] stays open until the last character ("(a)(b)": no)."""
    depth = 0
    for ch in s[:-1]:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if depth == 0:
            return False
    return True


def _equiv_normalized(a: str, b: str) -> bool:
    """Equivalence of two already-normalised answers."""
    if not a or not b:
        return False
    if a == b:
        return True
    coll_a, coll_b = _as_collection(a), _as_collection(b)
    if coll_a or coll_b:
        if not (coll_a and coll_b) or coll_a[0] != coll_b[0] or len(coll_a[1]) != len(coll_b[1]):
            return False
        return all(_equiv_normalized(x, y) for x, y in zip(coll_a[1], coll_b[1]))
    if _INTEGER_RE.fullmatch(a) and _INTEGER_RE.fullmatch(b):  # what sympy would say, without parsing
        return int(a) == int(b)
    expr_a, expr_b = parse_latex_expr(a), parse_latex_expr(b)
    if expr_a is None or expr_b is None:
        return False
    return sympy_equal(expr_a, expr_b)


def is_equiv(pred, label) -> bool:
    """Whether answer `pred` equals `label`: normalised strings, element-wise, or sympy equality.

    An empty prediction is never correct.
    """
    return _equiv_normalized(normalize_answer(pred), normalize_answer(label))


def label_candidates(label) -> list:
    """A label may be one answer or a list/tuple of accepted answers."""
    return list(label) if isinstance(label, (list, tuple)) else [label]


def grade_answer(pred: str, label) -> float:
    """1.0 if the extracted answer `pred` equals the label (or any label of a list), else 0.0."""
    return 1.0 if any(is_equiv(pred, lab) for lab in label_candidates(label)) else 0.0


def grade_math(response: str, label) -> int:
    """The `math` reward: 1 if the last boxed content equals the label (or any of a list of
    labels), else 0 (an int, as in slime). Unlike slime (0 without `\\boxed{}`), a response with
    no boxed answer is compared whole: the CPU toy task answers with a bare token
    (docs/plugins.md, deliberate differences). `grade_answer_verl` is slime's strict check."""
    if label is None:
        raise ValueError("rm_type 'math' needs sample.label (set --label-key)")
    boxed = extract_boxed_answer(response)
    return int(grade_answer(boxed if boxed is not None else response.strip(), label))


# slime's public names (slime.rollout.rm_hub.math_utils), on top of the functions above.
mathd_normalize_answer = normalize_answer


def extract_answer(passage: str) -> str | None:
    """slime's name: the content of the last `\\boxed{}` in `passage`, or None."""
    return extract_boxed_answer(passage) if passage else None


def remove_boxed(s: str) -> str | None:
    """`\\boxed{x}` -> `x`; None when `s` is not exactly one boxed expression."""
    if not s or last_boxed_only_string(s) != s:
        return None
    return extract_boxed_answer(s)


def grade_answer_mathd(given_answer: str, ground_truth: str) -> bool:
    """Equal after answer normalisation (string comparison only)."""
    given, truth = normalize_answer(given_answer), normalize_answer(ground_truth)
    return bool(given) and given == truth


def grade_answer_sympy(given_answer: str, ground_truth: str) -> bool:
    """Equal after normalisation, element-wise for tuples, or by bounded sympy equality."""
    return is_equiv(given_answer, ground_truth)


def grade_answer_verl(solution_str: str, ground_truth) -> bool:
    """slime's math check: needs a boxed answer in `solution_str` (else False), then mathd or
    sympy equality with `ground_truth` (itself unboxed when it contains `\\boxed`)."""
    if ground_truth is None or str(ground_truth) == "":
        return False
    ground_truth = str(ground_truth)
    if "\\boxed" in ground_truth:
        ground_truth = extract_answer(ground_truth) or ground_truth
    given = extract_answer(solution_str)
    if given is None:
        return False
    return grade_answer_mathd(given, ground_truth) or grade_answer_sympy(given, ground_truth)
