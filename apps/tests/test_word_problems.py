"""Word-problem world: determinism, skeleton-disjoint splits, answers recomputed from the text."""

from __future__ import annotations

import re

import numpy as np
import pytest

from unirl.apps.trainers.ar_config import Recipe
from unirl.apps.worlds.word_problems import KINDS, WordProblemsConfig, WordProblemsWorld, make_problem
from unirl.apps.worlds.word_problems_source import WordProblemsDataConfig
from unirl.reward.protocol import ScoreItem
from unirl.reward.rules.exact import ExactMatchScorer


def _recompute(kind: str, text: str) -> int:
    """The answer from the numbers in the story, independently of the generator."""
    n = [int(x) for x in re.findall(r"\d+", text)]
    if kind == "add":
        return n[0] + n[1]
    if kind == "sub":
        return n[0] - n[1]
    if kind == "mul":
        return n[0] * n[1]
    if kind == "div":
        assert n[0] % n[1] == 0
        return n[0] // n[1]
    if kind == "add_sub":
        return n[0] + n[1] - n[2]
    if kind == "change":  # "costs a ... buys b ... pays with c"
        return n[2] - n[0] * n[1]
    raise AssertionError(kind)


def test_worked_examples() -> None:
    rng = np.random.default_rng(0)
    p = make_problem("change", (9, 2, 26), rng)
    assert p.answer == 8 and p.target == "8" and p.level == 2 and p.skeleton == "change:9,2,26"
    assert "costs 9 dollars" in p.prompt and "buys 2 of them" in p.prompt and "26 dollars" in p.prompt
    assert p.solution == "2 * 9 = 18, 26 - 18 = 8\n#### 8"
    d = make_problem("div", (7, 3), rng)
    assert d.answer == 7 and "shares 21 " in d.prompt and "among 3 friends" in d.prompt


def test_answers_match_the_story_and_are_non_negative() -> None:
    world = WordProblemsWorld(WordProblemsConfig(levels=(0, 1, 2), max_operand=30))
    problems = world.sample(600, seed=3) + world.sample(200, seed=3, split="held_out")
    assert {p.kind for p in problems} == set(KINDS)
    for p in problems:
        assert p.answer == _recompute(p.kind, p.prompt) >= 0, p
        assert p.solution.endswith(f"#### {p.answer}")


def test_deterministic_and_seed_dependent() -> None:
    world = WordProblemsWorld()
    assert world.sample(50, seed=1) == world.sample(50, seed=1)
    assert world.sample(50, seed=1) != world.sample(50, seed=2)
    a = WordProblemsDataConfig(num_train=100, num_eval=20).build()
    b = WordProblemsDataConfig(num_train=100, num_eval=20).build()
    assert a.train_records() == b.train_records() and a.eval_records() == b.eval_records()


def test_splits_disjoint_by_skeleton_and_fraction() -> None:
    world = WordProblemsWorld()
    train = world.sample(1500, seed=0, unique=True)
    held = world.sample(300, seed=0, split="held_out", unique=True)
    assert len({p.skeleton for p in train}) == 1500 and len({p.skeleton for p in held}) == 300
    assert {p.skeleton for p in train}.isdisjoint({p.skeleton for p in held})
    assert {p.prompt for p in train}.isdisjoint({p.prompt for p in held})
    # The split is a function of the skeleton alone: another level set agrees on it.
    other = WordProblemsWorld(WordProblemsConfig(levels=(0,)))
    assert all(other.split_of(p.skeleton) == "held_out" for p in held)
    drawn = [world.split_of(p.skeleton) for p in world.sample(1, seed=0)]
    assert drawn == ["train"]
    rng = np.random.default_rng(0)
    skeletons = {f"add:{int(a)},{int(b)}" for a, b in rng.integers(2, 500, size=(4000, 2))}
    frac = np.mean([world.split_of(s) == "held_out" for s in skeletons])
    assert 0.17 < frac < 0.23


def test_records_score_with_last_number_and_sft_pairs() -> None:
    src = WordProblemsDataConfig(num_train=50, num_eval=10, levels=(2,)).build()
    rec = src.eval_records()[0]
    assert rec.id == "h0" and rec.answer is not None and rec.spec["level"] == 2
    scorer = ExactMatchScorer("last_number")
    ok, bad = scorer.score(
        [
            ScoreItem(prompt=rec.prompt, response=f"So the answer is {rec.answer}.", reference=rec.answer),
            ScoreItem(prompt=rec.prompt, response="It is 100001.", reference=rec.answer),
        ]
    )
    assert ok.total == 1.0 and bad.total == 0.0
    pairs = src.sft_pairs(4, seed=0, step=0)
    assert pairs == src.sft_pairs(4, seed=0, step=0) and pairs != src.sft_pairs(4, seed=0, step=1)
    assert all(t.split("#### ")[-1] == str(_recompute_from_solution(t)) for _, t in pairs)


def _recompute_from_solution(solution: str) -> int:
    return int(solution.splitlines()[0].split("= ")[-1])


def test_config_validation_and_recipe_union() -> None:
    with pytest.raises(ValueError, match="levels"):
        WordProblemsConfig(levels=(7,))
    with pytest.raises(ValueError, match="max_operand"):
        WordProblemsWorld(WordProblemsConfig(levels=(1,), max_operand=3)).sample(500, seed=0, unique=True)
    with pytest.raises(ValueError, match="extra"):
        WordProblemsDataConfig.model_validate({"kind": "word_problems", "typo": 1})
    field = Recipe.model_fields["data"]
    assert "WordProblemsDataConfig" in str(field.annotation) or "word_problems" in str(field)
