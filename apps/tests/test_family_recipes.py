"""The image- and video-family recipes: each validates and builds its family's bundle (tiny, path: null); slow:
each trains one FlowGRPO step through `unirl train` and its run exports to a folder the family's own
diffusers pipeline loads, holding the trained transformer weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from unirl.apps.cli import main
from unirl.apps.config import load
from unirl.apps.trainers.diffusion_config import Recipe

FAMILIES = {
    "qwen_image": ("QwenImageBundle", "QwenImagePipeline"),
    "flux2_klein": ("Flux2KleinBundle", "Flux2KleinPipeline"),
    "z_image": ("ZImageBundle", "ZImagePipeline"),
    "flux": ("FluxBundle", "FluxPipeline"),
    "wan": ("WanBundle", "WanPipeline"),
    "hunyuan_video": ("HunyuanVideoBundle", "HunyuanVideoPipeline"),
}
VIDEO = {"wan", "hunyuan_video"}  # DanceGRPO on the moving-shapes world; the image families FlowGRPO


def recipe_name(kind: str) -> str:
    return f"{kind}_tiny_dancegrpo" if kind in VIDEO else f"{kind}_tiny_flowgrpo"


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_family_recipe_validates_and_builds_its_bundle(kind: str) -> None:
    recipe = load(Recipe, recipe_name(kind))
    assert recipe.model.kind == kind and recipe.model.path is None
    if kind in VIDEO:  # the causal VAEs' 4k + 1 frames; the scheduler's static shift
        assert recipe.sampling.num_frames == 5 and not recipe.sampling.dynamic_shift
    else:
        assert recipe.sampling.dynamic_shift  # the family's own sigma policy
    torch.set_num_threads(1)
    bundle = recipe.model.build(torch.device("cpu"), recipe.seed)
    assert type(bundle).__name__ == FAMILIES[kind][0]
    assert bundle.dtype == torch.float32


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen_image", "flux2_klein", "z_image", "wan", "hunyuan_video"])
def test_family_recipe_trains_and_exports(kind: str, tmp_path: Path) -> None:
    import diffusers

    from unirl.apps.export import export_run

    run = tmp_path / "run"
    assert main(["train", recipe_name(kind), "rl.steps=1", "threads=1", "--run-dir", str(run)]) == 0
    out = export_run(run, "diffusers")
    pipe = getattr(diffusers, FAMILIES[kind][1]).from_pretrained(out, torch_dtype=torch.float32)
    recipe = load(Recipe, recipe_name(kind))
    base = recipe.model.build(torch.device("cpu"), recipe.seed).transformer.state_dict()
    trained = pipe.transformer.state_dict()
    assert trained.keys() == base.keys()
    assert any(not torch.equal(trained[k], base[k]) for k in base)  # the RL step reached the export
