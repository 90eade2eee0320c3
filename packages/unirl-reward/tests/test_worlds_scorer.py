"""World scorers satisfy the Scorer protocol and score like the checkers."""

from __future__ import annotations

import numpy as np
import pytest

from unirl.reward.config import PluginConfig
from unirl.reward.protocol import ScoreItem, Scorer
from unirl.reward.worlds.scorer import ArithmeticScorer, ShapesScorer


def _two_reds_left_of_blue() -> np.ndarray:
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    img[4:12, 2:10] = (255, 0, 0)
    img[18:26, 2:10] = (255, 0, 0)
    img[10:18, 20:28] = (0, 0, 255)
    return img


def test_shapes_scorer() -> None:
    scorer = ShapesScorer()
    assert isinstance(scorer, Scorer)
    img = _two_reds_left_of_blue()
    good, half = scorer.score(
        [
            ScoreItem(prompt="two red squares left of a blue square", image=img),
            # counts right, no extras, relation wrong -> 3 of 4 checks
            ScoreItem(prompt="two red squares right of a blue square", image=img),
        ]
    )
    assert good.total == 1.0 and good.components["correct"] == 1.0
    assert half.total == 0.75 and half.components == {
        "correct": 0.0,
        "score": 0.75,
        "count": 1.0,
        "no_extra": 1.0,
        "relation": 0.0,
    }
    strict = ShapesScorer(reward="correct").score(
        [ScoreItem(prompt="two red squares right of a blue square", image=img)]
    )
    assert strict[0].total == 0.0
    with pytest.raises(ValueError, match="not a shapes caption"):
        scorer.score([ScoreItem(prompt="a photo of a cat", image=img)])
    with pytest.raises(ValueError, match="needs item.image"):
        scorer.score([ScoreItem(prompt="a red square")])


def test_shapes_scorer_through_plugin_config() -> None:
    scorer = PluginConfig(
        target="unirl.reward.worlds.scorer:ShapesScorer", kwargs={"reward": "correct"}
    ).build()
    assert scorer.name == "shapes_checker"


def test_arithmetic_scorer() -> None:
    scorer = ArithmeticScorer()
    assert isinstance(scorer, Scorer)
    res = scorer.score(
        [
            ScoreItem(response="19", reference="19"),
            ScoreItem(response="18", reference="19"),
            ScoreItem(response="###", reference="19"),
        ]
    )
    assert [r.total for r in res] == [1.0, 0.0, 0.0]
    assert [r.components["parsed"] for r in res] == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="not an integer"):
        scorer.score([ScoreItem(response="1", reference="x")])
