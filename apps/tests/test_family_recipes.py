"""The image-family recipes: each validates and builds its family's bundle (tiny, path: null); slow:
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
}


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_family_recipe_validates_and_builds_its_bundle(kind: str) -> None:
    recipe = load(Recipe, f"{kind}_tiny_flowgrpo")
    assert recipe.model.kind == kind and recipe.model.path is None
    assert recipe.sampling.dynamic_shift  # the family's own sigma policy
    torch.set_num_threads(1)
    bundle = recipe.model.build(torch.device("cpu"), recipe.seed)
    assert type(bundle).__name__ == FAMILIES[kind][0]
    assert bundle.dtype == torch.float32


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen_image", "flux2_klein", "z_image"])
def test_family_recipe_trains_and_exports(kind: str, tmp_path: Path) -> None:
    import diffusers

    from unirl.apps.export import export_run

    run = tmp_path / "run"
    assert main(["train", f"{kind}_tiny_flowgrpo", "rl.steps=1", "threads=1", "--run-dir", str(run)]) == 0
    out = export_run(run, "diffusers")
    pipe = getattr(diffusers, FAMILIES[kind][1]).from_pretrained(out, torch_dtype=torch.float32)
    recipe = load(Recipe, f"{kind}_tiny_flowgrpo")
    base = recipe.model.build(torch.device("cpu"), recipe.seed).transformer.state_dict()
    trained = pipe.transformer.state_dict()
    assert trained.keys() == base.keys()
    assert any(not torch.equal(trained[k], base[k]) for k in base)  # the RL step reached the export
