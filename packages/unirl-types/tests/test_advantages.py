"""Worked numbers for every advantage mode."""

import math

import numpy as np
import pytest

from unirl.types import AdvantageConfig, Part, Reward, compute_advantages

# Group "a": rewards 1, 2, 3 -> mean 2, centred (-1, 0, 1).
#   population std = sqrt(2/3) = 0.816497; unbiased std = 1.
# Group "b": rewards 4, 4 -> zero variance -> A = 0.
# Group "c": a singleton (7) -> A = 0.
R = [1.0, 4.0, 2.0, 7.0, 4.0, 3.0]
G = ["a", "b", "a", "c", "b", "a"]  # non-contiguous and ragged on purpose


def test_group_zscore_population_std():
    adv = compute_advantages(R, G, AdvantageConfig(eps=0.0))
    s = math.sqrt(2 / 3)
    np.testing.assert_allclose(adv, [-1 / s, 0, 0, 0, 0, 1 / s], rtol=1e-12)


def test_group_zscore_unbiased_std_and_eps():
    adv = compute_advantages(R, G, AdvantageConfig(std="unbiased", eps=1e-6))
    np.testing.assert_allclose(adv, [-1 / (1 + 1e-6), 0, 0, 0, 0, 1 / (1 + 1e-6)], rtol=1e-12)


def test_batch_std():
    # batch population std of R: mean = 21/6 = 3.5; squared dev = 6.25+0.25+2.25+12.25+0.25+0.25 = 21.5
    # var = 21.5/6 = 3.583333; std = 1.892969
    adv = compute_advantages(R, G, AdvantageConfig(mode="batch_std", eps=0.0))
    s = math.sqrt(21.5 / 6)
    np.testing.assert_allclose(adv, [-1 / s, 0, 0, 0, 0, 1 / s], rtol=1e-12)


def test_mean_only_dr_grpo():
    adv = compute_advantages(R, G, AdvantageConfig(mode="mean_only"))
    np.testing.assert_allclose(adv, [-1, 0, 0, 0, 0, 1])


def test_rloo():
    # r_i - mean(others): 1 - (2+3)/2 = -1.5; 2 - 2 = 0; 3 - 1.5 = 1.5
    adv = compute_advantages(R, G, AdvantageConfig(mode="rloo"))
    np.testing.assert_allclose(adv, [-1.5, 0, 0, 0, 0, 1.5])


def test_global():
    adv = compute_advantages(R, G, AdvantageConfig(mode="global", eps=0.0))
    s = math.sqrt(21.5 / 6)
    np.testing.assert_allclose(adv, (np.array(R) - 3.5) / s, rtol=1e-12)


def test_clip():
    adv = compute_advantages([0.0, 0.0, 0.0, 10.0], ["g"] * 4, AdvantageConfig(clip=1.5, eps=0.0))
    # mean 2.5, population std sqrt((3*6.25 + 56.25)/4) = sqrt(18.75) = 4.330127 -> (-0.577, ..., 1.732)
    np.testing.assert_allclose(adv, [-2.5 / math.sqrt(18.75)] * 3 + [1.5], rtol=1e-12)


def test_all_equal_and_singletons_are_zero_not_nan():
    adv = compute_advantages([3.0, 3.0, 3.0, 5.0], ["g", "g", "g", "h"])
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert compute_advantages([1.0], ["x"], AdvantageConfig(mode="global")).tolist() == [0.0]


def test_nan_reward_names_the_sample():
    with pytest.raises(ValueError, match=r"sample s1 is nan"):
        compute_advantages([1.0, float("nan")], ["g", "g"], sample_ids=["s0", "s1"])


def test_group_size_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"group 'a' has 3 samples; advantage.group_size=2"):
        compute_advantages(R, G, AdvantageConfig(group_size=2))


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="expected \\[3\\]"):
        compute_advantages([1.0, 2.0], ["a", "b", "c"])


def test_part_compute_advantages_writes_parts():
    parts = [Part(name="d", reward=Reward(total=r)) for r in (0.0, 1.0)]
    Part.compute_advantages(parts, ["g", "g"], AdvantageConfig(mode="mean_only"))
    assert [p.advantage for p in parts] == [-0.5, 0.5]
    with pytest.raises(ValueError, match="no reward"):
        Part.compute_advantages([Part(name="d")], ["g"])
