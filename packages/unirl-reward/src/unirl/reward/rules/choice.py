"""Multiple-choice scorer: 1.0 when the chosen letter equals `item.reference` (e.g. "C")."""

from __future__ import annotations

from collections.abc import Sequence

from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs
from unirl.reward.rules.extract import extract_choice


class MultipleChoiceScorer:
    """Reads the option letter with `extract_choice`; no letter or a wrong one scores 0.0."""

    modality: Modality = "text"
    output_range = (0.0, 1.0)
    version = "1"

    def __init__(self, letters: str = "ABCD", name: str = "multiple_choice") -> None:
        extract_choice("", letters)  # validates `letters` up front
        self.letters = letters
        self.name = name

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        out = []
        for i, item in enumerate(items):
            ref = (item.reference or "").strip().strip("()").upper()
            if ref not in self.letters or len(ref) != 1:
                raise ValueError(
                    f"scorer {self.name!r}: item {i}.reference must be one of {list(self.letters)}, got {item.reference!r}"
                )
            pred = extract_choice(item.response or "", self.letters)
            out.append(
                ScoreResult(total=float(pred == ref), components={"extracted": float(pred is not None)})
            )
        return out
