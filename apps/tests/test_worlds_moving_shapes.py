"""The moving-shapes video world: every rendered video passes its own checker, the splits are
disjoint but compositional, SFT data is seeded, and the recipe's sizes are checked before compute."""

from __future__ import annotations

import numpy as np
import pytest

from unirl.apps.config import RecipeError, load
from unirl.apps.trainers.diffusion_config import Recipe
from unirl.apps.worlds.moving_shapes import MovingShapesDataConfig, MovingShapesWorld
from unirl.reward.worlds.moving_shapes import VOCAB, MotionSpec, check_video
from unirl.rollout.models.tiny.video_bundle import MOVING_SHAPES_VOCAB


def test_rendered_videos_pass_the_checker_and_move_as_captioned() -> None:
    world = MovingShapesWorld()
    pairs = world.sample(48, seed=3)
    for video, caption in pairs:
        assert video.shape == (4, 16, 16, 3) and video.dtype == np.uint8
        r = check_video(video, caption)
        assert r.correct, (caption, r.components)
        assert r.components["travel"] == pytest.approx(6.0)  # speed 2 px x 3 frame steps
    # a pure function of (seed, i): a prefix of a longer draw
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(world.sample(4, seed=3), pairs))


def test_splits_are_disjoint_and_every_word_is_trained() -> None:
    world = MovingShapesWorld(MovingShapesDataConfig(held_out=5))
    train, held = world.specs("train"), world.specs("held_out")
    assert len(train) == 19 and len(held) == 5 and not set(train) & set(held)
    for field in ("colour", "shape", "direction"):  # held-out captions are new combinations of known words
        assert {getattr(s, field) for s in held} <= {getattr(s, field) for s in train}
    assert set(MOVING_SHAPES_VOCAB) == set(VOCAB)  # the model's vocabulary is the grammar's
    videos, captions = world.config.build().sft_examples(6, seed=0, step=2)
    assert videos.shape == (6, 4, 16, 16, 3) and all(MotionSpec.parse(c) in train for c in captions)


def test_recipe_sizes_are_checked_before_compute() -> None:
    recipe = load(Recipe, "moving_shapes_dance")
    assert recipe.sampling.num_frames == recipe.data.num_frames == 4
    with pytest.raises(RecipeError, match="sampling.num_frames=None but model.resolution=16"):
        load(Recipe, "moving_shapes_dance", ["sampling.num_frames=null"])
    with pytest.raises(RecipeError, match="spans 17 px, more than resolution=16 - 2"):
        load(Recipe, "moving_shapes_dance", ["data.speed=4", "data.size_max=5"])


def test_sft_caption_noise_mislabels_that_fraction_of_the_videos_only() -> None:
    """`data.sft_caption_noise` p: the videos are the clean ones, ~p of the captions is a random
    training caption (the checker rejects those pairs unless the draw is the own caption), the same
    for the same (seed, step), never a held-out caption."""
    clean = MovingShapesDataConfig().build()
    noisy = MovingShapesDataConfig(sft_caption_noise=0.3).build()
    v0, c0 = clean.sft_examples(400, seed=1, step=5)
    v1, c1 = noisy.sft_examples(400, seed=1, step=5)
    assert np.array_equal(v0, v1)
    changed = [a != b for a, b in zip(c0, c1, strict=True)]
    assert 0.24 < np.mean(changed) < 0.34  # 0.3 x 18/19 (a draw may be the own caption); s.d. 0.023
    assert set(c1) <= set(noisy.world.captions("train"))
    assert noisy.sft_examples(400, seed=1, step=5)[1] == c1
    assert not any(check_video(v, c).correct for v, c, ch in zip(v1, c1, changed, strict=True) if ch)
    with pytest.raises(ValueError, match="sft_caption_noise"):
        MovingShapesDataConfig(sft_caption_noise=1.0)
