"""Arithmetic world: level contents, determinism, disjoint hash split, checker on targets."""

from __future__ import annotations

import pytest

from unirl.apps.worlds.arithmetic import ArithmeticWorld, ArithmeticWorldConfig, level_problems


def test_level_sizes_and_answers() -> None:
    assert len(list(level_problems(0))) == 100  # a, b in 0..9
    assert len(list(level_problems(2))) == sum(a + 1 for a in range(100))  # b in 0..a -> 5050
    assert len(list(level_problems(5))) == 900
    p = next(p for p in level_problems(5) if p.prompt == "12*7=")
    assert p.answer == 84 and p.target == "84" and p.level == 5
    assert all(p.answer >= 0 for p in level_problems(2))


def test_sampling_deterministic_and_split_disjoint() -> None:
    world = ArithmeticWorld()
    a, b = world.sample(64, seed=1), world.sample(64, seed=1)
    assert a == b and a != world.sample(64, seed=2)
    train = {p.prompt for p in world.problems("train")}
    held = {p.prompt for p in world.problems("held_out")}
    assert train.isdisjoint(held)
    assert 0.15 < len(held) / (len(train) + len(held)) < 0.25
    assert {p.prompt for p in world.sample(200, seed=0, split="held_out")} <= held
    assert {p.prompt for p in world.sample(200, seed=0, split="train")} <= train
    # The split is a function of the prompt alone: another level set agrees on shared prompts.
    other = ArithmeticWorld(ArithmeticWorldConfig(levels=(0,)))
    assert {p.prompt for p in other.problems("held_out")} == {
        p.prompt for p in world.problems("held_out") if p.level == 0
    }


def test_levels_are_sampled_uniformly() -> None:
    world = ArithmeticWorld(ArithmeticWorldConfig(levels=(0, 2)))
    levels = [p.level for p in world.sample(2000, seed=0)]
    assert abs(levels.count(0) / 2000 - 0.5) < 0.05


def test_checker_on_targets_and_malformed() -> None:
    world = ArithmeticWorld()
    for p in world.sample(50, seed=0):
        assert p.check(p.target).correct
        assert p.check(p.target + "<|im_end|>").correct
        assert not p.check(str(p.answer + 1)).correct
        assert not p.check("").correct and not p.check("??").correct


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="levels"):
        ArithmeticWorldConfig(levels=(9,))
    with pytest.raises(ValueError, match="held_out_fraction"):
        ArithmeticWorldConfig(held_out_fraction=1.0)
