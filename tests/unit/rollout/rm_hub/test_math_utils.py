"""Math answer extraction, normalisation and equivalence (slime.rollout.rm_hub.math_utils)."""

import pytest

from slime.rollout.rm_hub.latex_sympy import parse_latex_expr
from slime.rollout.rm_hub.math_utils import (
    extract_boxed_answer,
    grade_math,
    is_equiv,
    normalize_answer,
)

EQUIVALENT = [
    (r"\frac{1}{2}", "0.5"),
    (r"\dfrac12", "1/2"),
    (r"\dfrac{3}{4}", "3/4"),
    ("1,000", "1000"),
    (r"1{,}000", "1000"),
    (r"10\text{ cm}", "10"),
    ("10 cm", "10"),
    ("5 dollars", "5"),
    (r"\$5", "5"),
    (r"50\%", "50"),
    (r"45^\circ", "45"),
    (r"45^{\circ}", "45"),
    ("x=3", "3"),
    ("y = 2x+1", "1 + 2x"),
    ("3.0", "3"),
    ("2.50", "2.5"),
    ("$7$", "7"),
    (r"\mathrm{12}", "12"),
    (r"\!12", "12"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    ("(1, 2)", "(1,2)"),
    (r"\left[\frac{1}{2}, 3\right)", "[0.5,3)"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    (r"\sqrt2", r"\sqrt{2}"),
    (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}"),
    (r"\sqrt[3]{8}", "2"),
    (r"\frac{\pi}{2}", r"\pi/2"),
    ("x^2+2x+1", "(x+1)^2"),
    (r"-\frac{7}{3}", "-7/3"),
    ("10^{3}", "1000"),
    (r"\sin(x)^2+\cos(x)^2", "1"),
    (r"\sin(2x)", r"2\sin x\cos x"),
    ("1/(x-37/100)", "1/(x-0.37)"),
]

NOT_EQUIVALENT = [
    (r"\frac{1}{2}", "0.51"),
    ("0.51", "0.5"),
    ("1001", "1000"),
    ("3", "-3"),
    (r"\frac{1}{3}", "0.333"),
    ("(1,3)", "(1,2)"),
    ("[1,2)", "(1,2)"),
    ("(1,2,3)", "(1,2)"),
    ("x^2+2x", "(x+1)^2"),
    (r"\sqrt{3}", r"\sqrt{2}"),
    ("12m", "12"),  # a single-letter unit is only dropped after a space: 12m may be a product
    ("", "0"),
    ("42", "4 2 0"),
    (r"\frac{1}{0}", r"\frac{2}{0}"),  # undefined values are never equal
    (r"\sin x^2", r"\sin(x)^2"),
]


@pytest.mark.parametrize("pred,label", EQUIVALENT)
def test_equivalent_forms_are_equal(pred, label):
    assert is_equiv(pred, label)
    assert is_equiv(label, pred)


@pytest.mark.parametrize("pred,label", NOT_EQUIVALENT)
def test_different_answers_are_not_equal(pred, label):
    assert not is_equiv(pred, label)


def test_boxed_extraction_takes_the_last_balanced_group():
    text = r"First \boxed{1}, then \boxed{\frac{a}{b^{2}}} is final."
    assert extract_boxed_answer(text) == r"\frac{a}{b^{2}}"
    assert extract_boxed_answer(r"\fbox{42}") == "42"
    assert extract_boxed_answer(r"so $\boxed 7$") == "7"
    assert extract_boxed_answer("no box here") is None
    assert extract_boxed_answer(r"\boxed{unclosed") is None


def test_normalize_answer_folds_wrappers():
    assert normalize_answer(r"\boxed{\text{10 } \mathrm{cm}}") == "10"
    assert normalize_answer(r"\dfrac12") == r"\frac{1}{2}"
    assert normalize_answer("1,234,567.50") == "1234567.5"
    assert normalize_answer(12) == "12"


@pytest.mark.parametrize("hostile", ["9^9^9^9", "((2^64)^64)^64^64", "1" * 500, r"\input{x}"])
def test_hostile_or_unsupported_input_is_rejected_not_evaluated(hostile):
    assert parse_latex_expr(hostile) is None
    assert not is_equiv(hostile, "1")


def test_grade_math_uses_boxed_or_whole_response():
    assert grade_math(r"We get \boxed{\frac{1}{2}}.", "0.5") == 1
    assert grade_math(r"We get \boxed{0.51}.", "0.5") == 0
    assert grade_math(r"\boxed{1000}", "1,000") == 1
    assert grade_math("  1000\n", "1,000") == 1
    assert grade_math(r"\boxed{4}", ["3", "4"]) == 1.0
    with pytest.raises(ValueError, match="label"):
        grade_math(r"\boxed{4}", None)


@pytest.mark.parametrize("a", ["0", "1", "-0", "00", "007", "7", "-7", "10", "01", "-12", "+3", "3",
                               "123456789012345678901234567890"])
def test_integer_answers_compare_as_sympy_does(a):
    """Two integers skip the sympy parse; the verdict is the one sympy gives."""
    from slime.rollout.rm_hub.latex_sympy import sympy_equal

    for b in ["0", "7", "-7", "3", "10", "123456789012345678901234567890"]:
        na, nb = normalize_answer(a), normalize_answer(b)
        ea, eb = parse_latex_expr(na), parse_latex_expr(nb)
        by_sympy = na == nb or (ea is not None and eb is not None and sympy_equal(ea, eb))
        assert is_equiv(a, b) == by_sympy, (a, b)
