"""Shapes world: determinism, disjoint splits, renders the checker accepts, layouts that hold."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from unirl.apps.worlds.shapes import (
    ShapesWorld,
    ShapesWorldConfig,
    images_to_unit,
    relation_satisfied,
    render,
    unit_to_images,
)
from unirl.reward.worlds.shapes_checker import check_image
from unirl.reward.worlds.shapes_spec import parse_caption, spec_to_caption


@pytest.fixture(scope="module")
def world() -> ShapesWorld:
    return ShapesWorld()


def test_sampling_is_deterministic(world: ShapesWorld) -> None:
    a, b = world.sample(16, seed=3), world.sample(16, seed=3)
    assert [e.caption for e in a] == [e.caption for e in b]
    assert all(np.array_equal(x.image, y.image) for x, y in zip(a, b))
    c = world.sample(16, seed=4)
    assert [e.caption for e in a] != [e.caption for e in c]
    # A second world object with the same config gives the same split and samples.
    other = ShapesWorld()
    assert other.captions("held_out") == world.captions("held_out")
    assert np.array_equal(other.sample(4, seed=3)[0].image, a[0].image)


def test_splits_disjoint_by_meaning(world: ShapesWorld) -> None:
    train, held = world.captions("train"), world.captions("held_out")
    assert len(train) + len(held) == 402 and set(train).isdisjoint(held)
    # 20% of the 18 single-group and of the 192 canonical relation classes are held out:
    # round(3.6) = 4 single captions, round(38.4) = 38 classes x 2 orientations = 76 relation captions.
    assert sum(len(c.split()) == 3 for c in held) == 4
    assert sum(len(c.split()) > 3 for c in held) == 76
    train_meanings = {spec_to_caption(parse_caption(c).canonical()) for c in train}
    held_meanings = {spec_to_caption(parse_caption(c).canonical()) for c in held}
    assert train_meanings.isdisjoint(held_meanings)
    assert all(e.caption in set(held) for e in world.sample(50, seed=0, split="held_out"))
    assert all(e.caption in set(train) for e in world.sample(50, seed=0, split="train"))


@pytest.mark.parametrize("layout", ["free", "grid"])
def test_checker_accepts_every_render(layout: str) -> None:
    world = ShapesWorld(ShapesWorldConfig(layout=layout))  # type: ignore[arg-type]
    examples = world.sample(200, seed=1, split="all")
    assert all(check_image(e.image, e.spec).correct for e in examples)
    assert all(
        relation_satisfied(
            e.spec.relation, e.objects[: e.spec.groups[0].count], e.objects[e.spec.groups[0].count :]
        )
        for e in examples
    )


def test_checker_rejects_noise_and_mismatched_captions(world: ShapesWorld) -> None:
    rng = np.random.default_rng(0)
    examples = world.sample(200, seed=2, split="all")
    noise = [check_image(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), e.spec).correct for e in examples]
    assert np.mean(noise) <= 0.01
    wrong = [
        check_image(a.image, b.spec).correct
        for a, b in itertools.pairwise(examples)
        if a.spec.canonical() != b.spec.canonical()
    ]
    # Only coincidences pass (e.g. "A left of B" drawn also happens to put A above B): measured 0.8%.
    assert np.mean(wrong) <= 0.05


def test_objects_do_not_touch(world: ShapesWorld) -> None:
    for e in world.sample(100, seed=5, split="all"):
        boxes = [(o.x, o.y, o.x + o.size, o.y + o.size) for o in e.objects]
        for i, a in enumerate(boxes):
            assert min(a[0], a[1]) >= 1 and max(a[2], a[3]) <= 31
            for b in boxes[i + 1 :]:
                gap = max(b[0] - a[2], a[0] - b[2], b[1] - a[3], a[1] - b[3])
                assert gap >= world.config.gap


def test_render_pixels() -> None:
    from unirl.apps.worlds.shapes import PlacedObject

    img = render([PlacedObject("green", "square", 2, 3, 4)], 8)
    assert img.dtype == np.uint8 and img.shape == (8, 8, 3)
    assert (img[3:7, 2:6] == (0, 255, 0)).all() and img.sum() == 16 * 255


def test_unit_round_trip(world: ShapesWorld) -> None:
    images = np.stack([e.image for e in world.sample(4, seed=0)])
    x = images_to_unit(images)
    assert x.shape == (4, 3, 32, 32) and x.min() == -1.0 and x.max() == 1.0
    assert np.array_equal(unit_to_images(x), images)


def test_sub_grammar_and_config_errors() -> None:
    easy = ShapesWorld(ShapesWorldConfig(include_pairs=False, shapes=("square",)))
    assert sorted(easy.captions("all")) == sorted(
        f"{n} {c} {s}"
        for n, s in (("a", "square"), ("two", "squares"), ("three", "squares"))
        for c in ("red", "green", "blue")
    )
    with pytest.raises(ValueError, match="resolution"):
        ShapesWorldConfig(resolution=16)
    with pytest.raises(ValueError, match="grid"):
        ShapesWorldConfig(layout="grid", grid_cells=5)
    with pytest.raises(ValueError, match="no captions"):
        ShapesWorld(ShapesWorldConfig(include_pairs=False, include_single=False))


def test_sft_caption_noise_mislabels_that_fraction_only() -> None:
    """`sft_caption_noise` p: the images are the clean ones, a fraction ~p of the captions is a
    random training caption (the checker rejects ~all of those pairs), the same for the same
    (seed, step), never a held-out caption, and p=0 is the clean source."""
    from unirl.apps.worlds.shapes_source import ShapesDataConfig

    clean = ShapesDataConfig(max_count_pair=1).build()
    noisy = ShapesDataConfig(max_count_pair=1, sft_caption_noise=0.3).build()
    img0, cap0 = clean.sft_examples(400, seed=3, step=7)
    img1, cap1 = noisy.sft_examples(400, seed=3, step=7)
    assert np.array_equal(img0, img1)
    changed = np.mean([a != b for a, b in zip(cap0, cap1, strict=True)])
    assert 0.22 < changed < 0.34  # 0.3 minus the ~1/90 draws that pick the own caption; 400 draws: s.d. 0.023
    assert set(cap1) <= set(noisy.world.captions("train"))
    assert noisy.sft_examples(400, seed=3, step=7)[1] == cap1
    assert noisy.sft_examples(400, seed=3, step=8)[1] != cap1
    wrong = [check_image(im, c).correct for im, a, c in zip(img1, cap0, cap1, strict=True) if a != c]
    assert np.mean(wrong) < 0.1
    with pytest.raises(ValueError, match="sft_caption_noise"):
        ShapesDataConfig(sft_caption_noise=1.0)
