"""Uncertainty of held-out evaluations (worked numbers) and the report's headline built on it."""

from __future__ import annotations

import numpy as np
import pytest

from unirl.apps.evalstats import bootstrap_interval, distinct_fraction, paired_bootstrap, pairwise_diversity
from unirl.apps.report import gain_lines


def test_bootstrap_interval_resamples_whole_prompts() -> None:
    # a resample of {a: [1, 1], b: [0, 0]} is aa (1.0), bb (0.0) or ab (0.5): the interval is [0, 1]
    assert bootstrap_interval({"a": [1.0, 1.0], "b": [0.0, 0.0]}) == (0.0, 1.0)
    # every prompt half solved: no spread between prompts, the interval is the point
    assert bootstrap_interval({str(i): [0.0, 1.0] for i in range(6)}) == (0.5, 0.5)
    assert bootstrap_interval({}) == (0.0, 1.0)


def test_paired_bootstrap_resamples_whole_prompts() -> None:
    # prompt a goes 0/2 -> 2/2, b stays 2/2: the point gain is 1.0 - 0.5 = 0.5. A resample holds
    # a twice (gain 1, p = 1/4), b twice (gain 0, p = 1/4) or one of each (0.5): the 95% interval
    # is [0, 1], however many samples each prompt has.
    before, after = {"a": [0.0, 0.0], "b": [1.0, 1.0]}, {"a": [1.0, 1.0], "b": [1.0, 1.0]}
    assert paired_bootstrap(before, after) == (0.5, 0.0, 1.0)
    # every prompt gains the same: no spread, the interval is the point
    same = paired_bootstrap({str(i): [0.0, 1.0] for i in range(10)}, {str(i): [1.0, 1.0] for i in range(10)})
    assert same == pytest.approx((0.5, 0.5, 0.5))
    # only shared prompts count
    assert paired_bootstrap({"a": [0.0], "x": [1.0]}, {"a": [1.0]})[0] == 1.0
    with pytest.raises(ValueError, match="share no prompt"):
        paired_bootstrap({"a": [0.0]}, {"b": [1.0]})


def test_diversity_measures() -> None:
    black, white = np.zeros((2, 2, 3), np.uint8), np.full((2, 2, 3), 255, np.uint8)
    assert pairwise_diversity([black, black]) == 0.0  # a collapsed policy
    assert pairwise_diversity([black, black, white]) == pytest.approx(2 / 3)  # pairs: 0, 1, 1
    assert np.isnan(pairwise_diversity([black]))
    assert distinct_fraction(["12", "12", "3", "4"]) == 0.75


def test_report_headline_states_the_interval_and_warns_within_noise() -> None:
    evals = {
        "init": {"accuracy": 0.0, "pass_at_k": 0.0},
        "sft": {"accuracy": 0.5, "pass_at_k": 1.0, "diversity": 0.3},
        "rl@2": {"accuracy": 0.9, "pass_at_k": 0.5},
        "rl": {"accuracy": 0.5, "pass_at_k": 0.5, "diversity": 0.1},
    }
    noisy = {"sft": {"a": [0.0, 0.0], "b": [1.0, 1.0]}, "rl": {"a": [1.0, 1.0], "b": [0.0, 0.0]}}
    text = "\n".join(gain_lines(evals, noisy))
    # judged against SFT (not the intermediate rl@2), with the paired interval and the warning
    assert "rl vs sft: accuracy 50.0% -> 50.0% (+0.0 points); 95% interval -100.0 to +100.0 points" in text
    assert "(2 prompts, 4 samples" in text and "Warning: the gain is within the evaluation's noise" in text
    # pass@k's interval: the same bootstrap on each prompt's solved-at-least-once indicator
    assert (
        "pass@k 100.0% -> 50.0% (-50.0 points; 95% interval -100.0 to +100.0); sample diversity 0.300 -> 0.100"
        in text
    )
    assert "traded coverage for per-sample accuracy" in text
    clear = {"sft": {str(i): [0.0, 1.0] for i in range(8)}, "rl": {str(i): [1.0, 1.0] for i in range(8)}}
    evals["rl"] = {"accuracy": 1.0, "pass_at_k": 1.0}
    text = "\n".join(gain_lines(evals, clear))
    assert "+50.0 points); 95% interval +50.0 to +50.0" in text
    assert "pass@k 100.0% -> 100.0% (+0.0 points; 95% interval +0.0 to +0.0)." in text
    assert "Warning" not in text and "traded" not in text
    # a fall beyond noise is called out as such, and pass@k falling with it is not a trade
    evals["rl"] = {"accuracy": 0.25, "pass_at_k": 0.5}
    worse = {"sft": {str(i): [1.0, 1.0] for i in range(8)}, "rl": {str(i): [0.0, 1.0] for i in range(8)}}
    text = "\n".join(gain_lines(evals, worse))
    assert "accuracy fell beyond the evaluation's noise: rl made the policy worse than sft" in text
    assert "lost coverage and per-sample accuracy both" in text and "traded" not in text


def test_stage_names_split_rl_points_from_levels_and_baselines() -> None:
    from unirl.apps.evalstats import is_baseline, made_by_rl

    assert all(made_by_rl(n) for n in ("rl", "rl@20", "eval"))
    assert not any(made_by_rl(n) for n in ("init", "sft", "sft_oracle", "rl_unenhanced", "rl@x"))
    # the prompt enhancer's comparisons are baselines (phase eval_baseline), the run's stages are not
    assert all(is_baseline(n) for n in ("sft_unenhanced", "sft_oracle", "rl_unenhanced", "eval_oracle"))
    assert not any(is_baseline(n) for n in ("init", "sft", "rl@40", "rl"))
