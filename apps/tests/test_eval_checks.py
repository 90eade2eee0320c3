"""The per-check breakdown of an evaluation: each scorer component averaged over the samples that have it."""

from __future__ import annotations

import pytest

from unirl.apps.evalstats import check_rates
from unirl.types import Reward


def test_check_rates_average_each_component_over_the_samples_that_have_it() -> None:
    rewards = [
        Reward(total=1.0, components={"geneval": 1.0, "geneval/count": 1.0, "geneval/relation": 1.0}),
        Reward(total=0.5, components={"geneval": 0.5, "geneval/count": 0.5, "geneval/relation": 0.0}),
        Reward(total=0.0, components={"geneval": 0.0, "geneval/count": 0.0}),  # a one-group prompt
    ]
    rates = check_rates(rewards)
    # the scorer totals (no "/") are the reward itself, not a check; relation: 1 of 2 relation prompts
    assert rates == {"geneval/count": pytest.approx(0.5), "geneval/relation": pytest.approx(0.5)}
    assert check_rates([]) == {}
