"""RewardService: weighted combination (worked numbers), configs, and filling Sample rewards."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from pydantic import ValidationError

from unirl.reward.combine import WeightedScorer, combine, identity
from unirl.reward.config import ServiceConfig
from unirl.reward.protocol import ScoreItem, ScoreResult
from unirl.reward.service import RewardService
from unirl.types import ImagePrimitive, Part, Sample, SampleMetadata, TextPrimitive


class Const:
    """A tiny scorer with a fixed answer and one sub-component."""

    modality = "text"
    output_range = (-10.0, 10.0)
    version = "1"

    def __init__(self, value: float, name: str = "const") -> None:
        self.value, self.name = value, name

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        return [ScoreResult(self.value, {"raw": self.value * 2}) for _ in items]


def test_combine_worked_example():
    # weights (1.0, 0.5), totals (1.0, 4.0): total = 1*1 + 0.5*4 = 3.0
    scorers = [WeightedScorer("a", 1.0, Const(1.0)), WeightedScorer("b", 0.5, Const(4.0))]
    (r,) = combine(scorers, [ScoreItem(response="x")])
    assert r.total == 3.0
    assert r.components == {"a": 1.0, "a/raw": 2.0, "b": 4.0, "b/raw": 8.0}


def test_identity_tracks_weights_and_versions():
    a = [WeightedScorer("a", 1.0, Const(1.0))]
    b = [WeightedScorer("a", 2.0, Const(1.0))]
    assert identity(a) == identity([WeightedScorer("a", 1.0, Const(5.0))])  # values don't matter
    assert identity(a) != identity(b)


def test_duplicate_names_rejected():
    with pytest.raises(ValueError, match="unique"):
        RewardService.local([WeightedScorer("a", 1, Const(1)), WeightedScorer("a", 1, Const(2))])
    with pytest.raises(ValidationError, match="unique"):
        ServiceConfig.model_validate(
            {"scorers": [{"scorer": {"kind": "exact_match"}}, {"scorer": {"kind": "exact_match"}}]}
        )


def test_wrong_kind_lists_options():
    with pytest.raises(ValidationError) as e:
        ServiceConfig.model_validate({"scorers": [{"scorer": {"kind": "jpg"}}]})
    assert "'jpeg'" in str(e.value) and "'math_verify'" in str(e.value)


def test_yaml_config(tmp_path):
    p = tmp_path / "scorers.yaml"
    p.write_text(
        "scorers:\n"
        "  - {name: answer, weight: 1.0, scorer: {kind: exact_match, extractor: gsm8k}}\n"
        "  - {name: fmt, weight: 0.25, scorer: {kind: format, pattern: '.*####.*'}}\n"
    )
    svc = RewardService.local(ServiceConfig.from_yaml(p))
    res = svc.score([ScoreItem(response="#### 3", reference="3"), ScoreItem(response="3", reference="3")])
    assert [r.total for r in res] == [1.25, 0.0]


def _sample(i: int, text: str, answer: str) -> Sample:
    return Sample(
        id=f"s{i}",
        group_id="g",
        inputs=[TextPrimitive(text="what is 1+2?")],
        parts=[Part(name="ar", outputs=[TextPrimitive(text=text)], status="completed")],
        metadata=SampleMetadata(answer=answer),
    )


def test_score_samples_fills_part_reward():
    svc = RewardService.local(
        ServiceConfig.model_validate(
            {"scorers": [{"name": "em", "scorer": {"kind": "exact_match", "extractor": "last_number"}}]}
        )
    )
    samples = [_sample(0, "it is 3", "3"), _sample(1, "it is 4", "3")]
    rewards = svc.score_samples(samples, "ar")
    assert [s.part("ar").reward.total for s in samples] == [1.0, 0.0]
    assert rewards[0].components["em"] == 1.0


def test_score_samples_image_part_with_prompt_from_other_part():
    pixels = np.zeros((8, 8, 4), np.uint8)  # RGBA is converted to RGB
    s = Sample(
        id="s",
        group_id="g",
        inputs=[TextPrimitive(text="draw")],
        parts=[
            Part(name="ar", outputs=[TextPrimitive(text="a red cube")]),
            Part(name="diffusion", parent="ar", outputs=[ImagePrimitive(pixels=pixels)]),
        ],
    )
    seen = []

    class Spy(Const):
        modality = "image+text"

        def score(self, items):
            seen.extend(items)
            return super().score(items)

    RewardService.local([WeightedScorer("spy", 1.0, Spy(0.5))]).score_samples(
        [s], "diffusion", prompt_part="ar"
    )
    assert seen[0].prompt == "a red cube" and seen[0].image.shape == (8, 8, 3)
    assert s.part("diffusion").reward.total == 0.5
