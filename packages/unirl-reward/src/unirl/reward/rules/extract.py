"""Answer extraction from untrusted model text: pure functions that return None, never raise.

Each function bounds its work by `MAX_CHARS` (only the tail of a longer text is read, where
final answers live), so a pathological response cannot make extraction slow.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_CHARS = 20_000

_BOXED_OPENERS = ("\\boxed{", "\\fbox{", "\\boxed {")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")


def _tail(text: str) -> str:
    return text[-MAX_CHARS:]


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces; None if absent/unclosed.

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    """
    text = _tail(text)
    start = max(text.rfind(o) for o in _BOXED_OPENERS)
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def extract_gsm8k(text: str) -> str | None:
    """The number after the last `####` (GSM8K's answer marker), e.g. '#### 1,234' -> '1,234'."""
    text = _tail(text)
    k = text.rfind("####")
    if k < 0:
        return None
    m = _NUMBER.search(text[k + 4 : k + 4 + 100])
    return m.group(0) if m else None


def extract_last_number(text: str) -> str | None:
    """The last number-looking token in the text (a lenient fallback)."""
    found = _NUMBER.findall(_tail(text))
    return found[-1] if found else None


def parse_number(s: str) -> Fraction | None:
    """Exact rational value of '1,234', '-0.50', '3/4', '$12', '12.' (None if not a number)."""
    s = s.strip().replace(",", "").replace("$", "").replace("\\!", "").rstrip(".").strip()
    if not s or len(s) > 100:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def normalize_text(s: str) -> str:
    """Case-fold, collapse whitespace, strip surrounding punctuation/`$`/`\\text{}` wrappers."""
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = " ".join(s.split()).strip(" .$").lower()
    return s


def answers_match(predicted: str | None, reference: str) -> bool:
    """Numbers compare by exact rational value; anything else by `normalize_text` equality."""
    if predicted is None:
        return False
    p, r = parse_number(predicted), parse_number(reference)
    if p is not None and r is not None:
        return p == r
    return normalize_text(predicted) == normalize_text(reference)


_CHOICE_PATTERNS = (
    r"answer\s*(?:is|:)?\s*[:\-]?\s*\(?\**\s*([{L}])\b",
    r"\\boxed\{\s*\(?([{L}])\)?\s*\}",
    r"^\s*\(?([{L}])\)?[\s.:)]*$",
)


def extract_choice(text: str, letters: str = "ABCD") -> str | None:
    """The chosen option letter: 'answer is (B)', 'Answer: B', '\\boxed{B}', or a lone 'B' line.

    Later matches win (a model often restates its answer at the end). Case-sensitive on the
    letter so the article 'a' is not read as option A.
    """
    if not letters.isalpha() or not letters.isupper():
        raise ValueError(f"letters must be upper-case letters, got {letters!r}")
    text = _tail(text)
    best: tuple[int, str] | None = None
    for pat in _CHOICE_PATTERNS:
        rx = re.compile(pat.replace("{L}", letters), re.IGNORECASE if "answer" in pat else 0)
        flags_rx = rx if not pat.startswith("^") else re.compile(rx.pattern, re.MULTILINE)
        for m in flags_rx.finditer(text):
            letter = m.group(1).upper()
            if letter in letters and (best is None or m.start() > best[0]):
                best = (m.start(), letter)
    return best[1] if best else None
