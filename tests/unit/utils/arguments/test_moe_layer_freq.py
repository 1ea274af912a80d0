"""--moe-layer-freq parsing: ints, list literals and the [x]*n / list + list forms, no eval."""

import argparse

import pytest

from slime.utils.arguments.moe_layer_freq import parse_moe_layer_freq


@pytest.mark.parametrize("text,expected", [
    ("1", 1),
    ("2", 2),
    ("[1, 1, 0]", [1, 1, 0]),
    ("[1]*48", [1] * 48),
    ("3*[0]", [0, 0, 0]),
    ("([0]*2 + [1]*3)", [0, 0, 1, 1, 1]),
    ("[0]+[1,0]*2", [0, 1, 0, 1, 0]),
])
def test_valid_forms(text, expected):
    assert parse_moe_layer_freq(text) == expected


@pytest.mark.parametrize("text,reason", [
    ("[1, 1", "not valid syntax"),
    ("__import__('os')", "expected an int or a list"),
    ("[1]*-1", "expected an int or a list"),
    ("[2, 1]", "must be 0 or 1"),
    ("0", ">= 1"),
    ("1+1", "expected an int or a list"),
    ("[1]*10**9", "expected an int or a list"),
    ("[1.5]", "expected an int or a list"),
])
def test_invalid_forms_name_the_flag(text, reason):
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse_moe_layer_freq(text)
    assert "--moe-layer-freq" in str(info.value) and reason in str(info.value)
