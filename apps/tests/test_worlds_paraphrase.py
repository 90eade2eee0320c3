"""The prompt-enhancer world: noisy user prompts -> canonical captions, and the SFT pairs' vocabulary."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from unirl.apps.worlds.shapes_paraphrase import ShapesParaphraseDataConfig, uses_form


def test_uses_form_matches_whole_words_and_plurals() -> None:
    assert uses_form("draw 2 b boxs", "box") and uses_form("draw 2 b boxs", "b")
    assert not uses_form("blu sq", "b")  # a prefix of another word is not the form
    assert not uses_form("pic of r box x3", "3")  # the "x3" form is not the count word "3"
    assert uses_form("a dot", "a") and not uses_form("pair", "a")


def test_unseen_forms_leave_the_sft_pairs_and_stay_in_rl_and_eval() -> None:
    forms = ("trio", "box", "b")
    plain = ShapesParaphraseDataConfig().build()
    cut = ShapesParaphraseDataConfig(sft_unseen_forms=forms).build()
    # RL's prompts and the held-out ones are the same with or without the option
    assert [r.prompt for r in cut.train_records()] == [r.prompt for r in plain.train_records()]
    assert [r.prompt for r in cut.eval_records()] == [r.prompt for r in plain.eval_records()]
    sft = cut.sft_records()
    assert 0 < len(sft) < len(cut.train_records())
    assert not any(uses_form(r.prompt, f) for r in sft for f in forms)
    assert any(uses_form(r.prompt, "trio") for r in cut.eval_records())
    pairs = cut.sft_pairs(256, seed=0, step=3)
    assert {p for p, _ in pairs} <= {r.prompt for r in sft}
    assert pairs == cut.sft_pairs(256, seed=0, step=3)  # a pure function of (seed, step)


def test_rl_prompts_unlabelled_are_the_training_prompts_sft_had_no_rewrite_for() -> None:
    forms = ("trio", "box", "b")
    cut = ShapesParaphraseDataConfig(sft_unseen_forms=forms).build()
    rl = ShapesParaphraseDataConfig(sft_unseen_forms=forms, rl_prompts="unlabelled").build()
    sft = {r.prompt for r in rl.sft_records()}
    unlabelled = [r.prompt for r in rl.train_records()]
    # the training split is cut in two: SFT's labelled pairs and RL's unlabelled prompts
    assert sorted([*sft, *unlabelled]) == sorted(r.prompt for r in cut.train_records())
    assert unlabelled and not set(unlabelled) & sft
    assert all(any(uses_form(p, f) for f in forms) for p in unlabelled)
    assert [r.prompt for r in rl.eval_records()] == [
        r.prompt for r in cut.eval_records()
    ]  # evaluation unchanged
    assert len(rl.all_records()) == len(cut.train_records()) + len(cut.eval_records())
    with pytest.raises(ValueError, match=r"data.rl_prompts=unlabelled with data.sft_unseen_forms=\[\]"):
        ShapesParaphraseDataConfig(rl_prompts="unlabelled").build().train_records()


def test_unseen_forms_must_be_user_forms_not_canonical_words() -> None:
    with pytest.raises(ValidationError, match=r"sft_unseen_forms=\['three'\].*pick from"):
        ShapesParaphraseDataConfig(sft_unseen_forms=("three",))
    with pytest.raises(ValidationError, match="sft_unseen_forms"):
        ShapesParaphraseDataConfig(sft_unseen_forms=("trio", "purple"))


def test_rewrite_noise_mislabels_a_seeded_fraction_of_sft_targets_only() -> None:
    clean = ShapesParaphraseDataConfig().build()
    noisy = ShapesParaphraseDataConfig(sft_rewrite_noise=0.3).build()
    a, b = clean.sft_pairs(2000, seed=1, step=5), noisy.sft_pairs(2000, seed=1, step=5)
    assert [p for p, _ in a] == [p for p, _ in b]  # the same prompts, only targets change
    captions = {str(r.answer) for r in clean.all_records()}
    assert {t for _, t in b} <= captions  # a wrong target is still a canonical caption
    wrong = sum(ta != tb for (_, ta), (_, tb) in zip(a, b, strict=True)) / len(a)
    # p = 0.3 minus the draws that land on the prompt's own caption (1 in 18 specs)
    assert abs(wrong - 0.3 * 17 / 18) < 0.03
    assert b == noisy.sft_pairs(2000, seed=1, step=5)  # a pure function of (seed, step)
    # RL's prompts and evaluation never see the noise
    assert [(r.prompt, r.answer) for r in noisy.train_records()] == [
        (r.prompt, r.answer) for r in clean.train_records()
    ]
    assert [(r.prompt, r.answer) for r in noisy.eval_records()] == [
        (r.prompt, r.answer) for r in clean.eval_records()
    ]
