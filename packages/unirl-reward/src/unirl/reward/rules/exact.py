"""Exact-match scorers on extracted answers: boxed, GSM8K `#### N`, last number, whole response.

total = 1.0 when the extracted answer equals `item.reference` (numbers by exact rational
value, text after normalisation), else 0.0. A response with no extractable answer scores 0.0
and `components["extracted"] = 0.0`, so a run can tell format failures from wrong answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs
from unirl.reward.rules.extract import answers_match, extract_boxed, extract_gsm8k, extract_last_number

Extractor = Literal["boxed", "gsm8k", "last_number", "raw"]

EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "boxed": extract_boxed,
    "gsm8k": extract_gsm8k,
    "last_number": extract_last_number,
    "raw": lambda s: s,
}


class ExactMatchScorer:
    """1.0 if `extract(response)` matches `reference`, else 0.0 (never raises on model text)."""

    modality: Modality = "text"
    output_range = (0.0, 1.0)
    version = "1"

    def __init__(self, extractor: Extractor = "boxed", name: str | None = None) -> None:
        if extractor not in EXTRACTORS:
            raise ValueError(f"extractor must be one of {sorted(EXTRACTORS)}, got {extractor!r}")
        self.extractor = extractor
        self.name = name or f"exact_{extractor}"

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        out = []
        for i, item in enumerate(items):
            if item.reference is None:
                raise ValueError(
                    f"scorer {self.name!r} needs item.reference (the gold answer); item {i} has none"
                )
            pred = EXTRACTORS[self.extractor](item.response or "")
            ok = answers_match(pred, item.reference)
            out.append(ScoreResult(total=float(ok), components={"extracted": float(pred is not None)}))
        return out
