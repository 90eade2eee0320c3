"""Format scorer: 1.0 when the response matches a regular expression (e.g. `<think>...</think>`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs

MAX_CHARS = 100_000


class FormatScorer:
    """`mode="fullmatch"` (whole response, DOTALL) or `"search"` (anywhere). Over-long text scores 0.0."""

    modality: Modality = "text"
    output_range = (0.0, 1.0)

    def __init__(
        self, pattern: str, mode: Literal["fullmatch", "search"] = "fullmatch", name: str = "format"
    ) -> None:
        try:
            self._rx = re.compile(pattern, re.DOTALL)
        except re.error as e:
            raise ValueError(f"format pattern {pattern!r} is not a valid regular expression: {e}") from e
        if mode not in ("fullmatch", "search"):
            raise ValueError(f"mode must be 'fullmatch' or 'search', got {mode!r}")
        self.mode = mode
        self.name = name
        self.version = f"1+{mode}:{pattern}"

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        out = []
        for item in items:
            text = item.response or ""
            if len(text) > MAX_CHARS:
                out.append(ScoreResult(total=0.0))
                continue
            m = self._rx.fullmatch(text) if self.mode == "fullmatch" else self._rx.search(text)
            out.append(ScoreResult(total=float(m is not None)))
        return out
