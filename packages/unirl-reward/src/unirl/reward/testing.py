"""`ScorerContract`: the test class every Scorer passes (subclass it, provide two fixtures).

```python
class TestMyScorer(ScorerContract):
    @pytest.fixture
    def scorer(self): return MyScorer()
    @pytest.fixture
    def items(self): return [ScoreItem(...), ScoreItem(...), ScoreItem(...)]  # >= 2 valid items
```
Shipped in the package (not tests/) so out-of-tree scorers can run the same contract.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from unirl.reward.protocol import _NEEDS, ScoreItem, Scorer, ScoreResult

MODALITIES = set(_NEEDS)


class ScorerContract:
    """Mixin of pytest tests; needs fixtures `scorer` (a Scorer) and `items` (>= 2 valid ScoreItems)."""

    atol = 1e-5  # batch-vs-single tolerance (float kernels may differ slightly across batch sizes)

    def test_is_scorer(self, scorer: Any) -> None:
        assert isinstance(scorer, Scorer)
        assert isinstance(scorer.name, str) and scorer.name
        assert isinstance(scorer.version, str) and scorer.version
        assert scorer.modality in MODALITIES
        lo, hi = scorer.output_range
        assert lo < hi

    def test_one_result_per_item_in_range(self, scorer: Scorer, items: list[ScoreItem]) -> None:
        assert len(items) >= 2, "the contract needs at least two items"
        results = scorer.score(items)
        assert len(results) == len(items)
        lo, hi = scorer.output_range
        for r in results:
            assert isinstance(r, ScoreResult)
            assert math.isfinite(r.total) and lo <= r.total <= hi
            assert all(isinstance(k, str) and math.isfinite(v) for k, v in r.components.items())

    def test_empty_batch(self, scorer: Scorer) -> None:
        assert scorer.score([]) == []

    def test_batch_equals_one_by_one(self, scorer: Scorer, items: list[ScoreItem]) -> None:
        batched = scorer.score(items)
        single = [scorer.score([it])[0] for it in items]
        for b, s in zip(batched, single):
            assert math.isclose(b.total, s.total, rel_tol=self.atol, abs_tol=self.atol), (b, s)

    def test_deterministic(self, scorer: Scorer, items: list[ScoreItem]) -> None:
        a, b = scorer.score(items), scorer.score(items)
        assert [r.total for r in a] == [r.total for r in b]

    def test_missing_input_is_value_error(self, scorer: Scorer, items: list[ScoreItem]) -> None:
        field = _NEEDS[scorer.modality][0]
        broken = replace(items[0], **{field: None})  # type: ignore[arg-type]
        try:
            scorer.score([broken])
        except ValueError as e:
            assert field in str(e)
        else:
            raise AssertionError(f"{scorer.name} accepted an item without {field}")
