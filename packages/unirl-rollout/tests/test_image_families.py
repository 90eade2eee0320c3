"""Qwen-Image, FLUX.2 [klein], Z-Image and guidance-distilled FLUX.1 through FlowMatchPipeline.

Each family is a tiny random model built in code, saved with ``save_pretrained`` and loaded back
through the bundle's real ``from_pretrained``. Per family: the ODE sampler equals the family's own
diffusers pipeline for the same x_T and prompts (so the pinned sigmas, the timestep convention and
the CFG variant are the pipeline's), rollout -> replay gives ratio 1 in fp32, and a wrong path, a
missing component and a checkpoint of another family fail with the fix in the message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from diffusers import Flux2KleinPipeline, FluxPipeline, QwenImagePipeline

from unirl.rollout.models.flux import FluxBundle
from unirl.rollout.models.flux2 import Flux2KleinBundle
from unirl.rollout.models.qwen_image import QwenImageBundle
from unirl.rollout.models.z_image import ZImageBundle
from unirl.rollout.noise import initial_noise
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.rollout.schedules import static_shifted_sigmas
from unirl.types import DiffusionSamplingParams, NoiseRecipe, Sample, TextPrimitive

PROMPTS = ["a red circle", "two blue squares"]
FAMILIES = {"qwen_image": QwenImageBundle, "flux2_klein": Flux2KleinBundle, "z_image": ZImageBundle}
LOAD_KW = {
    "qwen_image": {},
    "flux2_klein": {"max_sequence_length": 64},
    "z_image": {"max_sequence_length": 64},
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, cls in FAMILIES.items():
        cls.tiny_pipeline(seed=0).save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def bundles(saved: dict[str, Path]) -> dict[str, object]:
    return {
        n: cls.from_pretrained(str(saved[n]), dtype=torch.float32, **LOAD_KW[n])
        for n, cls in FAMILIES.items()
    }


def samples() -> list[Sample]:
    return [
        Sample(id=f"f{i}", group_id=f"g{i}", inputs=[TextPrimitive(text=t)]) for i, t in enumerate(PROMPTS)
    ]


def params(**kw) -> DiffusionSamplingParams:  # type: ignore[no-untyped-def]
    base = dict(
        num_steps=3, guidance_scale=4.0, height=16, width=16, dynamic_shift=True, noise=NoiseRecipe(seed=1)
    )
    return DiffusionSamplingParams(**(base | kw))


def reference(name: str, bundle, x_T: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The family pipeline's final latents, in the bundle's unpacked layout, for guidance w = 4."""
    pipe, common = bundle.pipe, dict(num_inference_steps=3, height=16, width=16, output_type="latent")
    with torch.no_grad():
        if name == "qwen_image":  # true CFG needs a negative prompt; ours is the default ""
            packed = QwenImagePipeline._pack_latents(x_T, 2, 4, 8, 8)
            out = pipe(prompt=PROMPTS, negative_prompt=[""] * 2, true_cfg_scale=4.0, latents=packed, **common)
            return bundle._unpack(out.images, 8, 8)
        if name == "flux2_klein":  # returns de-normalised, unpatchified latents: undo both
            out = pipe(
                prompt=PROMPTS, guidance_scale=4.0, latents=x_T, max_sequence_length=64, **common
            ).images
            bn = bundle.vae.bn
            std = torch.sqrt(bn.running_var + bundle.vae.config.batch_norm_eps).view(1, -1, 1, 1)
            return (Flux2KleinPipeline._patchify_latents(out) - bn.running_mean.view(1, -1, 1, 1)) / std
        # Z-Image's guidance_scale g is our w - 1
        return pipe(prompt=PROMPTS, guidance_scale=3.0, latents=x_T, max_sequence_length=64, **common).images


@pytest.mark.parametrize("name", list(FAMILIES))
def test_ode_with_cfg_matches_the_family_pipeline(name: str, bundles) -> None:  # type: ignore[no-untyped-def]
    bundle = bundles[name]
    out = FlowMatchPipeline(bundle, default_params=params(sde_strategy="ode")).generate(
        samples(), rollout_step=0
    )
    seg = out[0].part("diffusion").segment
    shape = bundle.latent_shape(16, 16)
    x_T = initial_noise(shape, seed=1, keys=["sample:f0", "sample:f1"])
    ref = reference(name, bundle, x_T)
    # the pipeline's scheduler now holds the sigmas it used: ours are exactly those
    assert seg.sigmas == bundle.pipe.scheduler.sigmas.tolist()
    assert seg.sigmas != static_shifted_sigmas(3, 3.0)  # the family's policy, not the SD3 default
    ours = torch.stack([s.part("diffusion").segment.latent_at(3) for s in out])
    assert ours.shape == ref.shape == (2, *shape)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert (ours - x_T).abs().max() > 0.1  # the model moved the latents: not a vacuous match
    assert out[0].part("diffusion").outputs[0].pixels.shape == (16, 16, 3)


def _replay_ratio_one(bundle, *, guidance: float = 4.0) -> list:  # type: ignore[no-untyped-def]
    pipe = FlowMatchPipeline(bundle, default_params=params(guidance_scale=guidance, eta=0.7))
    parts = [s.part("diffusion") for s in pipe.generate(samples(), rollout_step=0)]
    for n, j in enumerate(parts[0].segment.sde_indices):
        r = pipe.replay_step(parts, j)
        stored = torch.stack([p.segment.log_probs[n] for p in parts])
        assert r.log_prob.requires_grad
        torch.testing.assert_close(torch.exp(r.log_prob - stored), torch.ones(2), atol=1e-6, rtol=0)
    return parts


@pytest.mark.parametrize("name", list(FAMILIES))
def test_rollout_replay_ratio_one(name: str, bundles) -> None:  # type: ignore[no-untyped-def]
    parts = _replay_ratio_one(bundles[name])
    conds = parts[0].conditions.tensors
    assert "negative_prompt_embeds" in conds  # true CFG: the negative prompt's conditions are cached
    if "prompt_embeds_mask" in conds:  # per-prompt lengths: the cached embeds are unpadded
        assert conds["prompt_embeds"].shape[0] == conds["prompt_embeds_mask"].sum()
        assert conds["prompt_embeds"].shape[0] != parts[1].conditions.tensors["prompt_embeds"].shape[0]


def test_distilled_klein_runs_no_cfg(bundles) -> None:  # type: ignore[no-untyped-def]
    pipe = bundles["flux2_klein"].pipe
    distilled = Flux2KleinPipeline(**pipe.components, is_distilled=True)
    bundle = Flux2KleinBundle(distilled, max_sequence_length=64)
    assert bundle.embedded_guidance
    parts = _replay_ratio_one(bundle)
    assert "negative_prompt_embeds" not in parts[0].conditions.tensors


def test_flux1_guidance_distilled_matches_flux_pipeline(tmp_path: Path) -> None:
    """FLUX.1-dev style: guidance is a model input (no CFG batch); sampled latents equal FluxPipeline's."""
    FluxBundle.tiny(seed=2, guidance_embeds=True).pipe.save_pretrained(tmp_path)
    bundle = FluxBundle.from_pretrained(str(tmp_path), dtype=torch.float32, max_sequence_length=8)
    assert bundle.embedded_guidance
    out = FlowMatchPipeline(bundle, default_params=params(sde_strategy="ode", guidance_scale=3.5)).generate(
        samples(), rollout_step=0
    )
    x_T = initial_noise((4, 8, 8), seed=1, keys=["sample:f0", "sample:f1"])
    with torch.no_grad():
        ref = bundle.pipe(
            prompt=PROMPTS, guidance_scale=3.5, num_inference_steps=3, height=16, width=16,
            latents=FluxPipeline._pack_latents(x_T, 2, 4, 8, 8), output_type="latent", max_sequence_length=8,
        ).images  # fmt: skip
    ref = FluxPipeline._unpack_latents(ref, 16, 16, bundle.pipe.vae_scale_factor)
    ours = torch.stack([s.part("diffusion").segment.latent_at(3) for s in out])
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    # the guidance value reaches the model: another scale gives other latents
    other = FlowMatchPipeline(bundle, default_params=params(sde_strategy="ode", guidance_scale=1.0)).generate(
        samples(), rollout_step=0
    )
    assert (other[0].part("diffusion").segment.latent_at(3) - ours[0]).abs().max() > 1e-3
    assert "negative_prompt_embeds" not in out[0].part("diffusion").conditions.tensors


@pytest.mark.parametrize("name", list(FAMILIES))
def test_loading_errors_name_the_problem_and_the_fix(name: str, saved, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cls = FAMILIES[name]
    with pytest.raises(FileNotFoundError, match=r"model.path='/no/such/dir' does not exist; fix:"):
        cls.from_pretrained("/no/such/dir")
    with pytest.raises(FileNotFoundError, match="no model_index.json"):
        cls.from_pretrained(str(tmp_path))
    other = next(n for n in FAMILIES if n != name)
    other_cls = json.loads((saved[other] / "model_index.json").read_text())["_class_name"]
    with pytest.raises(ValueError, match=rf"is a {other_cls} checkpoint.*fix: set model.kind='{other}'"):
        cls.from_pretrained(str(saved[other]))
    broken = tmp_path / "broken"  # every folder but the text encoder
    broken.mkdir()
    (broken / "model_index.json").write_text((saved[name] / "model_index.json").read_text())
    for sub in ("transformer", "vae", "tokenizer", "scheduler"):
        (broken / sub).mkdir()
    with pytest.raises(
        ValueError, match=r"missing the 'text_encoder' component.*folder text_encoder/ absent"
    ):
        cls.from_pretrained(str(broken))


def test_sd3_and_flux_loaders_check_the_folder_too(saved) -> None:  # type: ignore[no-untyped-def]
    from unirl.rollout.models.sd3 import SD3Bundle

    with pytest.raises(FileNotFoundError, match="does not exist; fix:"):
        FluxBundle.from_pretrained("./no/such/flux")
    with pytest.raises(ValueError, match=r"is a QwenImagePipeline checkpoint.*model.kind='qwen_image'"):
        SD3Bundle.from_pretrained(str(saved["qwen_image"]))
    with pytest.raises(ValueError, match=r"is a ZImagePipeline checkpoint.*model.kind='z_image'"):
        FluxBundle.from_pretrained(str(saved["z_image"]))
