"""Shapes-world grammar and checker: caption<->spec round trip, hand-drawn images, noise."""

from __future__ import annotations

import numpy as np
import pytest

from unirl.reward.worlds.shapes_checker import (
    CheckerConfig,
    check_image,
    classify_shape,
    connected_components,
    detect_objects,
)
from unirl.reward.worlds.shapes_spec import (
    VOCAB,
    ObjectGroup,
    ShapesSpec,
    all_specs,
    parse_caption,
    spec_to_caption,
)

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def canvas(n: int = 32) -> np.ndarray:
    return np.zeros((n, n, 3), dtype=np.uint8)


def square(img: np.ndarray, x: int, y: int, s: int, rgb: tuple[int, int, int]) -> None:
    img[y : y + s, x : x + s] = rgb


def disc(img: np.ndarray, x: int, y: int, s: int, rgb: tuple[int, int, int]) -> None:
    rows, cols = np.mgrid[0 : img.shape[0], 0 : img.shape[1]] + 0.5
    r = s / 2
    img[(cols - x - r) ** 2 + (rows - y - r) ** 2 <= r * r] = rgb


def test_grammar_size_and_round_trip() -> None:
    specs = all_specs()
    # 3 counts x 3 colours x 2 shapes = 18 single; 4 relations x (3 colours x 2 shapes x 2 counts)
    # x (2 other colours x 2 shapes x 2 counts) = 4 x 12 x 8 = 384 relation specs.
    assert len(specs) == 18 + 384
    captions = [spec_to_caption(s) for s in specs]
    assert len(set(captions)) == len(captions)
    for spec, caption in zip(specs, captions):
        assert parse_caption(caption) == spec
        assert set(caption.split()) <= set(VOCAB)


def test_caption_examples() -> None:
    spec = parse_caption("two red circles left of a blue square")
    assert spec == ShapesSpec(
        groups=(ObjectGroup(2, "red", "circle"), ObjectGroup(1, "blue", "square")), relation="left of"
    )
    assert spec.canonical() == spec
    flipped = parse_caption("a blue square right of two red circles")
    assert flipped.canonical() == spec
    assert (
        parse_caption("a green square above a red circle").canonical()
        == parse_caption("a red circle below a green square").canonical()
    )


@pytest.mark.parametrize(
    "bad",
    ["", "two red circle", "a red circles", "four red circles", "a purple circle", "a red circle left of"],
)
def test_parse_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_caption(bad)


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="different colours"):
        ShapesSpec((ObjectGroup(1, "red", "circle"), ObjectGroup(1, "red", "square")), "above")
    with pytest.raises(ValueError, match="relation"):
        ShapesSpec((ObjectGroup(1, "red", "circle"),), "above")


def test_connected_components_4_connectivity() -> None:
    mask = np.zeros((5, 5), dtype=bool)
    mask[0, 0] = mask[1, 1] = True  # diagonal neighbours: two components under 4-connectivity
    mask[3:5, 3:5] = True
    sizes = sorted(len(c) for c in connected_components(mask))
    assert sizes == [1, 1, 4]


def test_classify_shape_disc_vs_square() -> None:
    cfg = CheckerConfig()
    for s in (6, 7, 8, 9):
        img = canvas()
        disc(img, 4, 4, s, RED)
        square(img, 18, 18, s, RED)
        comps = sorted(connected_components(img[..., 0] > 0), key=lambda c: c[:, 0].min())
        assert [classify_shape(c, cfg) for c in comps] == ["circle", "square"]


def test_hand_drawn_scene_is_correct() -> None:
    img = canvas()
    disc(img, 2, 4, 8, RED)
    disc(img, 2, 18, 8, RED)
    square(img, 20, 10, 8, BLUE)
    result = check_image(img, "two red circles left of a blue square")
    assert result.correct and result.score == 1.0
    assert result.components == {"count_0": 1.0, "count_1": 1.0, "no_extra": 1.0, "relation": 1.0}
    # Same image, wrong relation / count / shape / colour: each fails its own check.
    assert check_image(img, "two red circles right of a blue square").components["relation"] == 0.0
    assert check_image(img, "a red circle left of a blue square").components["count_0"] == 0.0
    assert check_image(img, "two red squares left of a blue square").components["count_0"] == 0.0
    wrong_colour = check_image(img, "two green circles left of a blue square")
    assert wrong_colour.components["no_extra"] == 0.0 and not wrong_colour.correct


def test_shape_check_can_be_disabled() -> None:
    img = canvas()
    disc(img, 10, 10, 8, GREEN)
    assert not check_image(img, "a green square").correct
    assert check_image(img, "a green square", CheckerConfig(check_shape=False)).correct


def test_specks_ignored_and_blur_tolerated() -> None:
    img = canvas()
    square(img, 10, 10, 8, (200, 40, 30))  # dimmed, slightly impure red still counts
    img[0, 0] = RED  # a one-pixel speck is below min_area
    assert check_image(img, "a red square").correct
    faint = canvas()
    square(faint, 10, 10, 8, (60, 0, 0))  # too dark to be an object
    assert detect_objects(faint) == []


def test_noise_scores_near_zero() -> None:
    rng = np.random.default_rng(0)
    specs = all_specs()
    hits = [
        check_image(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), specs[i % len(specs)]).correct
        for i in range(100)
    ]
    assert sum(hits) <= 2


def test_blank_image_fails_every_spec() -> None:
    assert not any(check_image(canvas(), s).correct for s in all_specs()[::7])


def test_input_validation() -> None:
    with pytest.raises(ValueError, match="RGB"):
        check_image(np.zeros((8, 8), dtype=np.uint8), "a red circle")
    with pytest.raises(TypeError, match="uint8"):
        check_image(np.zeros((8, 8, 3), dtype=np.float32), "a red circle")


def test_worlds_checkers_import_without_torch() -> None:
    import subprocess
    import sys

    code = "import sys, unirl.reward.worlds; sys.exit(int('torch' in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
