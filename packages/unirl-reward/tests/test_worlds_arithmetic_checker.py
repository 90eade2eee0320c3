"""Arithmetic exact-match checker: parsing of the final integer, malformed output never raises."""

from __future__ import annotations

import pytest

from unirl.reward.worlds.arithmetic_checker import check_answer, parse_final_integer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("19", 19),
        (" 19", 19),
        ("= 19", 19),
        ("-7", -7),
        ("the answer is 42", 42),
        ("12+7=19", 19),  # the last integer wins
        ("19\n20", 19),  # only the first line by default
        ("", None),
        ("abc", None),
        ("=", None),
        ("9" * 40, None),  # runaway digits are garbage, not an answer
    ],
)
def test_parse_final_integer(text: str, expected: int | None) -> None:
    assert parse_final_integer(text) == expected


def test_check_answer_exact_match() -> None:
    assert check_answer("19", 19).correct
    assert check_answer("19", 19).reward == 1.0
    assert not check_answer("18", 19).correct
    assert check_answer("18", 19).reward == 0.0
    assert check_answer("19\n20", 20, first_line_only=False).correct


@pytest.mark.parametrize("junk", ["", "\x00\x01", "+-", "=====", "1 2 3 x", "nineteen"])
def test_malformed_is_wrong_never_crashes(junk: str) -> None:
    result = check_answer(junk, 19)
    assert result.correct is False


def test_non_string_completion_is_wrong() -> None:
    assert not check_answer(None, 0).correct  # type: ignore[arg-type]
