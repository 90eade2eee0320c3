"""`loads_finite`: json.loads for valid bodies; NaN, infinities and overflow refused with their path."""

from __future__ import annotations

import json

import pytest

from unirl.reward.server.finite_json import NonFiniteNumber, loads_finite


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1.5, "b": [1e308, -0.0, 2, "NaN"], "c": {"d": -1.7976931348623157e308}}',
        "[]",
        "3",
        '{"x": 1, "x": 2}',
    ],
)
def test_valid_bodies_parse_as_json_loads(text):
    assert loads_finite(text) == json.loads(text)
    assert loads_finite(text.encode()) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "loc", "literal"),
    [
        ('{"a": {"b": [0, 1, NaN]}}', ("body", "a", "b", 2), "NaN"),
        ('{"a": Infinity}', ("body", "a"), "Infinity"),
        ('{"a": [{"x": 1}, {"x": -Infinity}]}', ("body", "a", 1, "x"), "-Infinity"),
        ('{"a": 1e999}', ("body", "a"), "1e999"),  # float("1e999") overflows to inf
        ('{"a": [-1e999]}', ("body", "a", 0), "-1e999"),
        ('{"a": NaN, "a": 1}', ("body", "a"), "NaN"),  # json.loads would keep only the 1
        ("NaN", ("body",), "NaN"),
    ],
)
def test_non_finite_numbers_name_their_path(text, loc, literal):
    with pytest.raises(NonFiniteNumber) as e:
        loads_finite(text.encode())
    assert (e.value.loc, e.value.literal) == (loc, literal)
    assert f"{'.'.join(map(str, loc))}: Input should be a finite number (got {literal})" in str(e.value)


def test_malformed_json_is_still_a_decode_error():
    with pytest.raises(json.JSONDecodeError):
        loads_finite(b"{not json")
