"""Weighted combination of scorers into one total with named components (pure, local)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from unirl.reward.protocol import ScoreItem, Scorer, ScoreResult


@dataclass(frozen=True)
class WeightedScorer:
    """A scorer in a combination: its component name and the weight of its total."""

    name: str
    weight: float
    scorer: Scorer

    def __post_init__(self) -> None:
        if not math.isfinite(self.weight):
            raise ValueError(f"scorer {self.name!r}: weight must be finite, got {self.weight}")
        if not self.name or "/" in self.name:
            raise ValueError(f"scorer name must be non-empty without '/', got {self.name!r}")


def check_unique(scorers: Sequence[WeightedScorer]) -> None:
    names = [s.name for s in scorers]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"scorer names must be unique, repeated: {dup}; set `name:` on each entry")
    if not scorers:
        raise ValueError("a RewardService needs at least one scorer")


def combine(scorers: Sequence[WeightedScorer], items: Sequence[ScoreItem]) -> list[ScoreResult]:
    """total = sum_i weight_i * scorer_i.total; components[name_i] = scorer_i.total (unweighted),
    and a scorer's own components appear as `name_i/key`.

    Example: weights (1.0, 0.5), scorer totals (1.0, 4.0) -> total 1.0 + 2.0 = 3.0.
    """
    totals = [0.0] * len(items)
    components: list[dict[str, float]] = [{} for _ in items]
    for ws in scorers:
        results = ws.scorer.score(items)
        if len(results) != len(items):
            raise RuntimeError(
                f"scorer {ws.name!r} returned {len(results)} results for {len(items)} items (a scorer bug)"
            )
        for i, r in enumerate(results):
            totals[i] += ws.weight * r.total
            components[i][ws.name] = r.total
            for k, v in r.components.items():
                components[i][f"{ws.name}/{k}"] = v
    return [ScoreResult(total=t, components=c) for t, c in zip(totals, components)]


def identity(scorers: Sequence[WeightedScorer]) -> str:
    """A short hash of (name, class, version, weight) of every scorer: equal iff they score alike."""
    desc = [[s.name, type(s.scorer).__name__, str(s.scorer.version), repr(float(s.weight))] for s in scorers]
    return hashlib.sha256(json.dumps(desc).encode()).hexdigest()[:16]
