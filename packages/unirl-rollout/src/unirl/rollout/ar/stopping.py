"""Stop-string handling on decoded text (host side, run every few decode steps, not per token)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Character index of the earliest occurrence of any stop string in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def cut_at_stop_string(ids: Sequence[int], decode: Decode, stops: Sequence[str]) -> tuple[int, str] | None:
    """Truncate a response at its first stop string.

    Returns ``(num_tokens, text)``: the shortest token prefix whose decoded text contains a stop
    string (the token completing the stop string is kept, since the model chose it and its
    log-prob is trained on), and that prefix's text cut *before* the stop string (the stop string
    is not part of the output text). None when no stop string occurs.

    Finds the prefix by binary search over prefix lengths (``O(log n)`` decodes); this assumes
    "prefix text contains a stop string" is monotone in the prefix length, which holds for
    tokenizers whose decode of a prefix is a prefix of the full decode.
    """
    stops = [s for s in stops if s]
    if not stops or first_stop(decode(ids), stops) is None:
        return None
    lo, hi = 1, len(ids)  # invariant: prefix of length hi contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if first_stop(decode(ids[:mid]), stops) is not None:
            hi = mid
        else:
            lo = mid + 1
    text = decode(ids[:hi])
    cut = first_stop(text, stops)
    return hi, text[: cut if cut is not None else len(text)]
