"""The unified-model trainer (issue 20): one backbone thinks then draws. A real step: two Parts per
Sample with lineage, the one image reward (against the ORIGINAL prompt) credited to both, advantages
per Part within the prompt's group, both tracks' first-update ratio 1 (trainside, fp32 CPU), one
optimizer step; SFT parts of both tracks; the recipe's errors; the shortened recipe learns."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from unirl.apps.config import RecipeError, load_dict, validate
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers.unified import Recipe, UnifiedTrainer
from unirl.types import to_torch

TINY = ["device=cpu", "threads=1", "model.hidden_size=32", "model.num_layers=1", "model.conv_channels=[8,16]",
        "image_sampling.num_steps=4", "rl.steps=1", "rl.prompts_per_step=2", "rl.samples_per_prompt=4",
        "rl.geometry.micro_batch_size=4", "eval.num_prompts=2", "eval.samples_per_prompt=1", "eval.grid_size=2",
        "eval.every=0", "sft.steps=1", "sft.batch_size=4"]  # fmt: skip
FLOW_GRPO = ["image_sampling.sde_strategy=flow_sde", "image_sampling.eta=0.7",
             "rl.image.algorithm={kind: flow_grpo, clip_range: 1.0e-3}"]  # fmt: skip
"""The image track on FlowGRPO (per-step log-probs: a ratio to check); the recipe's default is DiffusionNFT."""
# JPEG size: continuous in the pixels, so an untrained model's images get rewards that differ (the
# checker gives its blank drafts one constant score: zero advantages, nothing to train)
DENSE = {"scorers": [{"name": "jpeg", "weight": 1.0, "scorer": {"kind": "jpeg"}}]}


def trainer(tmp_path: Path, extra: list[str] = ()) -> UnifiedTrainer:
    data = load_dict("shapes_unified", [*TINY, *extra])
    data["reward"] = DENSE  # dense: an untrained model still gets rewards that differ
    recipe = validate(Recipe, data)
    return UnifiedTrainer(recipe, RunDir(tmp_path / "run", recipe.model_dump(mode="json"), tensorboard=False))


def test_one_rl_step_two_parts_one_reward_both_on_policy(tmp_path: Path) -> None:
    t = trainer(tmp_path, FLOW_GRPO)
    train = t.begin_phase("rl", starting=True)
    samples, extra = t.collect(t.cfg.rl, t.data.train_records(), 0)
    assert len(samples) == 8 and 0.0 <= extra["ar/plan_exact"] <= 1.0
    for s in samples:
        ar, im = s.part("ar"), s.part("image")
        assert [p.name for p in s.parts] == ["ar", "image"] and im.parent == "ar" and ar.parent is None
        # the image is conditioned on exactly the prompt + plan tokens the text track sampled
        n = len(ar.segment.prompt_ids) + len(ar.segment.response_ids)  # type: ignore[union-attr]
        ctx = to_torch(im.conditions.tensors["context_ids"])  # type: ignore[union-attr]
        assert ctx[:n].tolist() == [*ar.segment.prompt_ids, *ar.segment.response_ids]  # type: ignore[union-attr]
        # one reward, scored against the ORIGINAL prompt's meaning, credited to both Parts
        assert ar.reward == im.reward and s.metadata.answer is not None
    rewards = np.array([s.part("image").reward.total for s in samples]).reshape(2, 4)  # type: ignore[union-attr]
    # group z-score, population std + 1e-6 (the AdvantageConfig default), the same for both Parts
    want = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True) + 1e-6)
    for track in ("ar", "image"):
        adv = np.array([s.part(track).advantage for s in samples]).reshape(2, 4)
        np.testing.assert_allclose(adv, want, atol=1e-6)
    before = {k: v.detach().clone() for k, v in t.bundle.model.state_dict().items()}
    parts = t.train_parts(samples)  # both tracks' Parts, track by track
    assert parts == [s.part("ar") for s in samples] + [s.part("image") for s in samples]
    m = train(parts)
    for track in ("ar", "image"):  # first update of an on-policy batch: ratio exactly 1 (fp32 CPU)
        assert m[f"{track}/ratio_min"] == pytest.approx(1.0, abs=1e-6)
        assert m[f"{track}/ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert m["num_optimizer_steps"] == 1.0 and m["loss"] == pytest.approx(m["ar/loss"] + m["image/loss"])
    after = t.bundle.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_sft_parts_pair_each_plan_with_its_render(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    parts = t.sft_parts(4, step=0)
    text, image = parts[:4], parts[4:]
    assert [p.name for p in parts] == ["ar"] * 4 + ["image"] * 4
    for a, im in zip(text, image):
        seg = a.segment
        assert seg.response_ids[-1] == t.bundle.eos_token_id  # type: ignore[union-attr]
        assert t.bundle.decode(seg.response_ids) == a.outputs[0].text  # type: ignore[union-attr]
        ctx = to_torch(im.conditions.tensors["context_ids"])  # type: ignore[union-attr]
        assert ctx[: len(seg.prompt_ids) + len(seg.response_ids)].tolist() == [
            *seg.prompt_ids,
            *seg.response_ids,
        ]  # type: ignore[union-attr]
    m = t.begin_phase("sft")(parts)
    assert (
        math.isfinite(m["ar/nll"]) and math.isfinite(m["image/flow_mse"]) and m["num_optimizer_steps"] == 1.0
    )


def test_recipe_errors_name_the_field() -> None:
    base = load_dict("shapes_unified")
    with pytest.raises(RecipeError, match="image_sampling.height/width=16/16 but data.resolution=32"):
        validate(Recipe, load_dict("shapes_unified", ["image_sampling.height=16", "image_sampling.width=16"]))
    with pytest.raises(RecipeError, match="neither rl.ar nor rl.image"):
        validate(Recipe, load_dict("shapes_unified", ["rl.ar=null", "rl.image=null"]))
    with pytest.raises(RecipeError, match="rl.ar.weight"):
        validate(Recipe, load_dict("shapes_unified", ["rl.ar.weight=-1"]))
    with pytest.raises(RecipeError, match=r"diffusion_nft uses the backend's EMA as its old policy"):
        validate(Recipe, load_dict("shapes_unified", ["backend.ema=null"]))
    with pytest.raises(RecipeError, match="diffusion_nft learns from ODE samples"):
        validate(
            Recipe,
            load_dict("shapes_unified", ["image_sampling.sde_strategy=flow_sde", "image_sampling.eta=0.7"]),
        )
    assert validate(Recipe, base).rl.image.algorithm.kind == "diffusion_nft"  # type: ignore[union-attr]
    assert validate(Recipe, load_dict("shapes_unified", FLOW_GRPO)).rl.image.algorithm.kind == "flow_grpo"  # type: ignore[union-attr]


def test_nft_step_samples_images_with_the_old_policy_and_text_live(tmp_path: Path) -> None:
    """DiffusionNFT on the image track: the image engine samples inside the backend's EMA (the old
    policy), the text engine with the live weights; one step trains both tracks."""
    t = trainer(tmp_path)
    train = t.begin_phase("rl", starting=True)
    samples, _ = t.collect(t.cfg.rl, t.data.train_records(), 0)
    m = train(t.train_parts(samples))
    assert m["ar/ratio_max"] == pytest.approx(1.0, abs=1e-6) and math.isfinite(m["image/loss"])
    assert t.engine.engines["image"].sampling_context == t.backend.ema_weights
    assert t.engine.engines["ar"].sampling_context is None


KL = ["backend.reference=frozen_copy", "rl.ar.algorithm.kl_coef=0.1", "rl.image.algorithm.kl_coef=1.0"]


def test_kl_to_the_sft_result_on_both_tracks(tmp_path: Path) -> None:
    """backend.reference=frozen_copy: RL's start (the SFT result) is both tracks' reference. On the
    first step the policy is the reference (both penalties exactly 0); after an update they are not."""
    t = trainer(tmp_path, KL)
    t.begin_phase("sft")(t.sft_parts(4, step=0))  # move off the init weights the backend snapshotted
    train = t.begin_phase("rl", starting=True)
    samples, _ = t.collect(t.cfg.rl, t.data.train_records(), 0)
    m = train(t.train_parts(samples))
    assert m["ar/kl"] == pytest.approx(0.0, abs=1e-7) and m["image/kl"] == pytest.approx(0.0, abs=1e-10)
    samples, _ = t.collect(t.cfg.rl, t.data.train_records(), 1)
    m = train(t.train_parts(samples))
    assert m["ar/kl"] > 1e-9 and m["image/kl"] > 1e-12
    with pytest.raises(
        RecipeError, match=r"rl.ar.algorithm.kl_coef=0.1 needs a reference policy.*frozen_copy"
    ):
        validate(Recipe, load_dict("shapes_unified", ["backend.reference=none"]))
