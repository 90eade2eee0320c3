"""Scorer adapters (the `unirl.reward.protocol.Scorer` contract) for the world checkers.

Use from a reward config with the plugin kind until a first-class config kind exists:
``{kind: plugin, target: "unirl.reward.worlds.scorer:ShapesScorer", kwargs: {reward: score}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs
from unirl.reward.worlds.arithmetic_checker import check_answer
from unirl.reward.worlds.shapes_checker import CheckerConfig, check_image
from unirl.reward.worlds.shapes_spec import parse_caption


class ShapesScorer:
    """Scores a shapes-world image against its prompt (a caption of the shapes grammar).

    reward="score": total = fraction of the spec's checks passed (dense, for RL);
    reward="correct": total = 1.0 only when every check passes (the held-out accuracy metric).
    Components (always): correct, score, count (mean over groups), no_extra; relation for
    two-group prompts. A prompt outside the grammar is a caller error (ValueError).
    """

    modality: Modality = "image+text"
    output_range = (0.0, 1.0)
    version = "1"

    def __init__(
        self,
        reward: Literal["score", "correct"] = "score",
        check_shape: bool = True,
        name: str = "shapes_checker",
    ) -> None:
        if reward not in ("score", "correct"):
            raise ValueError(f"ShapesScorer reward={reward!r}: allowed 'score' or 'correct'")
        self.reward = reward
        self.config = CheckerConfig(check_shape=check_shape)
        self.name = name

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        out = []
        for i, item in enumerate(items):
            try:
                spec = parse_caption(str(item.prompt))
            except ValueError as err:
                raise ValueError(
                    f"scorer {self.name!r}: item {i} prompt is not a shapes caption: {err}"
                ) from err
            r = check_image(item.image, spec, self.config)  # type: ignore[arg-type]
            comps = {
                "correct": float(r.correct),
                "score": r.score,
                "count": float(np.mean([v for k, v in r.components.items() if k.startswith("count_")])),
                "no_extra": r.components["no_extra"],
            }
            if "relation" in r.components:
                comps["relation"] = r.components["relation"]
            out.append(ScoreResult(total=comps[self.reward], components=comps))
        return out


class ArithmeticScorer:
    """1.0 when the response's final integer (first line) equals the integer `reference`, else 0.0."""

    modality: Modality = "text"
    output_range = (0.0, 1.0)
    version = "1"

    def __init__(self, name: str = "arithmetic_exact") -> None:
        self.name = name

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        out = []
        for i, item in enumerate(items):
            try:
                answer = int(str(item.reference).strip())
            except ValueError as err:
                raise ValueError(
                    f"scorer {self.name!r}: item {i} reference {item.reference!r} is not an integer"
                ) from err
            result = check_answer(item.response or "", answer)
            out.append(
                ScoreResult(total=result.reward, components={"parsed": float(result.parsed is not None)})
            )
        return out
