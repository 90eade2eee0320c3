"""The moving-shapes video checker on hand-drawn videos: colour, shape and direction of motion with
frame-level rates, worked out pixel by pixel."""

from __future__ import annotations

import numpy as np
import pytest

from unirl.reward.protocol import ScoreItem
from unirl.reward.worlds.moving_shapes import (
    VOCAB,
    MotionSpec,
    MovingShapesScorer,
    all_motion_specs,
    check_video,
)


def square_video(xs: list[int], ys: list[int], colour=(255, 0, 0), size: int = 5) -> np.ndarray:  # type: ignore[no-untyped-def]
    """A 16x16 video: one filled square of side ``size`` with top-left (xs[f], ys[f]) in frame f."""
    v = np.zeros((len(xs), 16, 16, 3), dtype=np.uint8)
    for f, (x, y) in enumerate(zip(xs, ys)):
        v[f, y : y + size, x : x + size] = colour
    return v


def test_grammar_round_trip_and_vocab() -> None:
    specs = all_motion_specs()
    assert len(specs) == 24 and len({s.caption for s in specs}) == 24
    assert MotionSpec.parse("a blue square moving up") == MotionSpec("blue", "square", "up")
    assert set(" ".join(s.caption for s in specs).split()) == set(VOCAB)
    with pytest.raises(ValueError, match="not of the form"):
        MotionSpec.parse("a red circle left")
    with pytest.raises(ValueError, match="direction='sideways'"):
        MotionSpec.parse("a red circle moving sideways")


def test_a_square_moving_left_passes_and_the_wrong_direction_fails() -> None:
    v = square_video([9, 7, 5, 3], [5, 5, 5, 5])  # centroid x 11 -> 5: travel 6 px left
    r = check_video(v, "a red square moving left")
    assert r.correct and r.components == {"object": 1.0, "shape": 1.0, "motion": 1.0, "travel": 6.0}
    r = check_video(v, "a red square moving right")  # travel -6: no motion credit
    assert (
        r.components["motion"] == 0.0 and r.components["travel"] == -6.0 and r.score == pytest.approx(2 / 3)
    )
    r = check_video(v, "a red circle moving left")  # a square fills its box: the shape check fails
    assert r.components["shape"] == 0.0 and not r.correct
    r = check_video(v, "a green square moving left")  # no green object in any frame
    assert r.components == {"object": 0.0, "shape": 0.0, "motion": 0.0, "travel": 0.0}


def test_frame_level_rates_and_the_motion_thresholds() -> None:
    v = square_video([9, 7, 5, 3], [5, 5, 5, 5])
    v[1, 0:4, 0:4] = (0, 0, 255)  # a blue speck-free extra object in frame 1 only
    r = check_video(v, "a red square moving left")
    assert r.components["object"] == 0.75  # 3 of 4 frames clean: one bad frame costs 1/4
    assert r.components["motion"] == 1.0 and not r.correct  # travel from the first to the last clean frame
    still = square_video([6, 6, 6, 7], [5, 5, 5, 5])  # 1 px of travel < min_travel 2
    assert check_video(still, "a red square moving right").components["motion"] == 0.0
    diagonal = square_video([3, 5, 7, 9], [1, 3, 5, 7])  # 6 right and 6 down: not twice as far along
    assert check_video(diagonal, "a red square moving right").components["motion"] == 0.0


def test_scorer_reward_modes() -> None:
    v = square_video([3, 5, 7, 9], [5, 5, 5, 5])
    items = [
        ScoreItem(prompt="a red square moving right", video=v),
        ScoreItem(prompt="a red square moving up", video=v),
    ]
    dense = MovingShapesScorer(reward="score").score(items)
    assert [r.total for r in dense] == [1.0, pytest.approx(2 / 3)]
    assert [r.total for r in MovingShapesScorer(reward="correct").score(items)] == [1.0, 0.0]
    with pytest.raises(ValueError, match="item 0"):
        MovingShapesScorer().score([ScoreItem(prompt="two red squares", video=v)])
