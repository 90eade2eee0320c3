"""TextSegment.versions: which policy sampled which tokens (partial rollouts)."""

import numpy as np
import pytest
from pydantic import ValidationError

from unirl.types import Sample, TextSegment, VersionSpan, from_json, to_json


def seg(starts: list[int], versions: list[int], n: int = 6) -> TextSegment:
    spans = [VersionSpan(start=s, version=v, weight_version=2 * v) for s, v in zip(starts, versions)]
    return TextSegment(
        prompt_ids=[1], response_ids=list(range(n)), log_probs=np.zeros(n, np.float32), versions=spans
    )


def test_token_versions_and_oldest() -> None:
    s = seg([0, 2, 5], [3, 4, 6])
    # tokens 0-1 from v3, 2-4 from v4, 5 from v6
    assert s.token_versions() == [3, 3, 4, 4, 4, 6]
    assert s.oldest_version == 3
    plain = TextSegment(prompt_ids=[1], response_ids=[2, 3])
    assert plain.token_versions() is None and plain.oldest_version is None


@pytest.mark.parametrize(
    ("starts", "versions"),
    [([1], [0]), ([0, 0], [0, 1]), ([0, 3], [1, 1]), ([0, 6], [0, 1]), ([0, 2], [2, 1])],
)
def test_bad_spans_are_refused(starts: list[int], versions: list[int]) -> None:
    with pytest.raises(ValidationError, match="versions must start at token 0"):
        seg(starts, versions)


def test_spans_round_trip() -> None:
    from unirl.types import Part

    s = Sample(id="s", group_id="g", parts=[Part(name="ar", segment=seg([0, 4], [1, 2]))])
    back = from_json(Sample, to_json(s))
    assert back.part("ar").segment.token_versions() == [1, 1, 1, 1, 2, 2]  # type: ignore[union-attr]
