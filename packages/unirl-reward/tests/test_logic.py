"""Pure logic of the model scorers (no torch): GenEval box checks, OCR matching, frame sampling."""

from __future__ import annotations

import numpy as np
import pytest

from unirl.reward.models.geneval import GenEvalScorer
from unirl.reward.models.geneval_logic import (
    Detection,
    Spec,
    box_color,
    evaluate,
    iou,
    nms,
    relative_position,
)
from unirl.reward.models.ocr import OcrScorer, extract_quoted, levenshtein, ocr_reward
from unirl.reward.models.video import frame_indices
from unirl.reward.protocol import ScoreItem
from unirl.reward.testing import ScorerContract


def test_iou_and_nms():
    # two 10x10 boxes overlapping in a 5x10 strip: inter 50, union 150 -> 1/3
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(1 / 3)
    dets = [
        Detection("cube", 0.9, (0, 0, 10, 10)),
        Detection("cube", 0.8, (1, 0, 11, 10)),
        Detection("ball", 0.7, (1, 0, 11, 10)),
    ]
    kept = nms(dets)  # the 0.8 cube overlaps the 0.9 cube with IoU 9/11 > 0.5; the ball is another class
    assert [(d.label, d.score) for d in kept] == [("cube", 0.9), ("ball", 0.7)]


def test_relative_position_geneval_rule():
    a, b = (0, 0, 10, 10), (30, 0, 40, 10)  # a centred at x=5, b at x=35, same row
    assert relative_position(a, b) == {"left of"}
    assert relative_position(b, a) == {"right of"}
    assert relative_position((0, 0, 10, 10), (0, 30, 10, 40)) == {"above"}
    # offset (2, 0) is within 0.1 x (10 + 10) = 2 of slack: no relation
    assert relative_position((0, 0, 10, 10), (2, 0, 12, 10)) == set()
    # diagonal at 45 degrees: dx = dy = 0.707 > 0.5 -> both
    assert relative_position((0, 0, 2, 2), (40, 40, 42, 42)) == {"left of", "above"}


def _scene():
    img = np.full((40, 80, 3), 255, np.uint8)
    img[10:30, 5:25] = (220, 30, 30)  # red square on the left
    img[10:30, 50:70] = (30, 60, 220)  # blue square on the right
    return img, [Detection("cube", 0.9, (5, 10, 25, 30)), Detection("ball", 0.8, (50, 10, 70, 30))]


def test_box_color_and_evaluate_worked():
    img, dets = _scene()
    assert box_color(img, dets[0].box) == "red" and box_color(img, dets[1].box) == "blue"
    spec = Spec.from_metadata(
        {"objects": ["cube", "ball"], "counts": [1, 1], "colors": ["red", "blue"], "position": "left of"}
    )
    assert evaluate(spec, dets, img) == {"count": 1.0, "color": 1.0, "position": 1.0, "strict": 1.0}
    wrong = Spec.from_metadata(
        {"objects": ["cube", "ball"], "counts": [2, 1], "colors": ["blue", ""], "position": "above"}
    )
    assert evaluate(wrong, dets, img) == {"count": 0.0, "color": 0.0, "position": 0.0, "strict": 0.0}


@pytest.mark.parametrize(
    "meta",
    [
        {},
        {"objects": []},
        {"objects": ["a"], "counts": [1, 2]},
        {"objects": ["a"], "colors": ["mauve"]},
        {"objects": ["a"], "position": "left of"},
        {"objects": ["a", "b"], "position": "near"},
    ],
)
def test_bad_spec_is_value_error(meta):
    with pytest.raises(ValueError, match="metadata"):
        Spec.from_metadata(meta)


class OracleDetector:
    """Finds solid colour blobs (a programmatic detector for synthetic scenes): red -> cube, blue -> ball."""

    def detect(self, images, queries):
        out = []
        for img in images:
            dets = []
            for label, rgb in (("cube", (220, 30, 30)), ("ball", (30, 60, 220))):
                ys, xs = np.nonzero((img == rgb).all(-1))
                if len(xs):
                    dets.append(Detection(label, 1.0, (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)))
            out.append(dets)
        return out


class TestGenEvalContract(ScorerContract):
    @pytest.fixture
    def scorer(self):
        return GenEvalScorer(OracleDetector(), batch_size=2)

    @pytest.fixture
    def items(self):
        img, _ = _scene()
        meta = {"objects": ["cube", "ball"], "colors": ["red", "blue"], "position": "left of"}
        return [
            ScoreItem(image=img, metadata=meta),
            ScoreItem(image=img[:, ::-1].copy(), metadata=meta),
            ScoreItem(image=np.full((8, 8, 3), 255, np.uint8), metadata=meta),
        ]

    def test_worked(self, scorer, items):
        # original: all 3 checks pass; mirrored: presence+colour pass, position fails -> 2/3; blank: 0
        assert [r.total for r in scorer.score(items)] == pytest.approx([1.0, 2 / 3, 0.0])


def test_ocr_pure_functions():
    assert extract_quoted('a shop sign that says "OPEN 24h" in neon') == "OPEN 24h"
    assert extract_quoted("a sign reading “Café”") == "Café"
    assert extract_quoted("it's a dog's life") is None  # apostrophes are not quotes
    assert levenshtein("kitten", "sitting") == 3
    assert ocr_reward("0PEN", "open") == 0.75
    assert ocr_reward("O P E N", "open") == 1.0  # case and spaces ignored
    assert ocr_reward("completely different", "open") == 0.0


class EchoOcr:
    def __init__(self, texts):
        self.texts = texts

    def read(self, images):
        return [self.texts[int(im[0, 0, 0])] for im in images]


class TestOcrContract(ScorerContract):
    @pytest.fixture
    def scorer(self):
        return OcrScorer(EchoOcr(["hello", "help"]))

    @pytest.fixture
    def items(self):
        img = [np.full((4, 4, 3), i, np.uint8) for i in range(2)]
        return [ScoreItem(prompt='say "hello"', image=img[0]), ScoreItem(prompt='say "hello"', image=img[1])]

    def test_worked(self, scorer, items):
        # "help" vs "hello": substitute p->l, insert o: distance 2 of 5 -> 0.6
        assert [r.total for r in scorer.score(items)] == pytest.approx([1.0, 0.6])

    def test_prompt_without_quotes_is_caller_error(self, scorer, items):
        with pytest.raises(ValueError, match="no quoted text"):
            scorer.score([ScoreItem(prompt="no quotes", image=items[0].image)])


def test_frame_indices():
    assert frame_indices(10, 4) == [0, 3, 6, 9]
    assert frame_indices(3, 16) == [0, 1, 2]
    assert frame_indices(5, 1) == [0]
