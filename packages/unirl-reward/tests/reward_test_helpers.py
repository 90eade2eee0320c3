"""Scorers for server tests: a counting one and one that blocks until released."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from unirl.reward.protocol import ScoreItem, ScoreResult, check_inputs


class LengthScorer:
    """total = len(response); counts every item it scores (to prove no double counting)."""

    name = "length"
    modality = "text"
    output_range = (0.0, float("inf"))
    version = "1"

    def __init__(self) -> None:
        self.scored = 0
        self.batch_sizes: list[int] = []
        self.lock = threading.Lock()

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        with self.lock:
            self.scored += len(items)
            self.batch_sizes.append(len(items))
        return [ScoreResult(float(len(it.response or ""))) for it in items]


class GatedScorer(LengthScorer):
    """Blocks inside `score` until `gate` is set; `entered` is set when a batch arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        self.entered.set()
        if not self.gate.wait(30):
            raise RuntimeError("gate never opened")
        return super().score(items)
