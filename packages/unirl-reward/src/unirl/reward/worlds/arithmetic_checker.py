"""Exact-match checker for the arithmetic world: the final integer of a completion vs the answer.

A completion is any text a policy produced; the answer is read as the last signed integer in it
(after an optional "=" the prompt already ended with), so "42", " 42<|im_end|>", "= 42" and
"the answer is 42" all give 42. Malformed text (no integer, runaway digits) scores 0, never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_INT = re.compile(r"[-+]?\d+")
_MAX_DIGITS = 18  # longer digit runs are garbage from an untrained policy, not answers


@dataclass(frozen=True)
class ArithmeticCheck:
    """correct: the parsed integer equals the answer; parsed: that integer, or None if none found."""

    correct: bool
    parsed: int | None

    @property
    def reward(self) -> float:
        return 1.0 if self.correct else 0.0


def parse_final_integer(completion: str, *, first_line_only: bool = True) -> int | None:
    """The last signed integer of the completion (of its first line by default), or None."""
    if not isinstance(completion, str):
        return None
    text = completion.strip()
    if first_line_only:
        text = text.split("\n", 1)[0]
    matches = _INT.findall(text)
    if not matches:
        return None
    token = matches[-1]
    if len(token.lstrip("+-")) > _MAX_DIGITS:
        return None
    return int(token)


def check_answer(completion: str, answer: int, *, first_line_only: bool = True) -> ArithmeticCheck:
    """Exact match of the completion's final integer against `answer`."""
    parsed = parse_final_integer(completion, first_line_only=first_line_only)
    return ArithmeticCheck(correct=parsed is not None and parsed == int(answer), parsed=parsed)
