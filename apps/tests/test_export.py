"""`unirl export`: the exported checkpoint loads with the family's own library and samples what the
trainer's policy samples (same noise / prompt -> same latents; same prompt -> same tokens).

Run directories are made the way the trainer makes them (RunDir with the resolved recipe, the
recipe's model and backend, ``save_checkpoint``), with the trainable weights moved off their
initial values (a stand-in for training, so a wrong export cannot pass by exporting the base). The
slow test exports a run that ``unirl train`` itself wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import StableDiffusion3Pipeline
from transformers import AutoModelForCausalLM, AutoTokenizer

from unirl.apps.cli import main
from unirl.apps.config import RecipeError, load_dict, validate
from unirl.apps.export import export_run
from unirl.apps.run_dir import RunDir
from unirl.apps.trainers import ar_config, diffusion_config
from unirl.rollout.noise import initial_noise
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.checkpoint import save_checkpoint
from unirl.types import DiffusionSamplingParams, NoiseRecipe, Sample, TextPrimitive

PROMPTS = ["a red circle", "two blue squares"]
LORA = ["backend.lora.r=4", "backend.lora.alpha=8", "backend.lora.target_modules=[to_q,to_k,to_v,to_out.0]"]


def make_run(root: Path, recipe_cls: Any, name: str, overrides: list[str]) -> tuple[Any, Any, Any]:
    """A run directory with one checkpoint; returns (recipe, bundle, backend) of the 'trained' policy."""
    torch.set_num_threads(1)
    recipe = validate(recipe_cls, load_dict(name, overrides))
    RunDir(root, recipe.model_dump(mode="json"), tensorboard=False)
    torch.manual_seed(recipe.seed)
    cpu = torch.device("cpu")
    if recipe.trainer == "diffusion":
        bundle = recipe.model.build(cpu, recipe.seed)
        module = bundle.transformer
    else:
        bundle = recipe.model.model_copy(update={"device": "cpu"}).build()
        module = bundle.model
    backend = recipe.backend.build(module, device=cpu)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # "training": every trainable weight moves (LoRA B leaves zero)
        for p in backend.module.parameters():
            if p.requires_grad:
                local = (
                    p.to_local() if hasattr(p, "to_local") else p
                )  # FSDP2 DTensor: the whole shard at world 1
                local.add_(0.05 * torch.randn(local.shape, generator=g).to(local.dtype))
    save_checkpoint(root / "checkpoints" / "latest", backend, extra={})
    return recipe, bundle, backend


def policy_latents(bundle: Any) -> torch.Tensor:
    """Final ODE latents [2, C, h, w] of the trainer's policy (FlowMatchPipeline) for PROMPTS."""
    params = DiffusionSamplingParams(
        num_steps=3, guidance_scale=4.5, height=16, width=16, sde_strategy="ode", noise=NoiseRecipe(seed=1)
    )
    samples = [
        Sample(id=f"s{i}", group_id=f"g{i}", inputs=[TextPrimitive(text=t)]) for i, t in enumerate(PROMPTS)
    ]
    out = FlowMatchPipeline(bundle, default_params=params).generate(samples, rollout_step=0)
    return torch.stack([s.part("diffusion").segment.latent_at(3) for s in out])


def pipeline_latents(pipe: StableDiffusion3Pipeline) -> torch.Tensor:
    """The same sample drawn by diffusers' own StableDiffusion3Pipeline (x_T of sample ids s0, s1)."""
    x_T = initial_noise((4, 8, 8), seed=1, keys=["sample:s0", "sample:s1"])
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(
            prompt=PROMPTS, num_inference_steps=3, guidance_scale=4.5, height=16, width=16, latents=x_T,
            output_type="latent", max_sequence_length=8,
        ).images  # fmt: skip


def test_sd3_lora_run_exports_merged_and_as_a_peft_adapter(tmp_path: Path) -> None:
    from peft import PeftModel

    run = tmp_path / "run"
    _, bundle, _ = make_run(run, diffusion_config.Recipe, "sd3_tiny_flowgrpo", LORA)
    ours = policy_latents(bundle)

    merged = export_run(run, "diffusers", merge_lora=True)
    assert merged == run / "export-diffusers"
    pipe = StableDiffusion3Pipeline.from_pretrained(merged, torch_dtype=torch.float32)
    assert not any("lora" in k for k in pipe.transformer.state_dict())  # a plain SD3 transformer
    torch.testing.assert_close(pipeline_latents(pipe), ours, atol=1e-5, rtol=1e-5)
    meta = json.loads((merged / "unirl_export.json").read_text())
    assert meta["lora"] == "merged" and meta["class"] == "SD3Transformer2DModel"

    unmerged = export_run(run, "diffusers", out=tmp_path / "unmerged")
    base = StableDiffusion3Pipeline.from_pretrained(unmerged, torch_dtype=torch.float32)
    base_only = pipeline_latents(base)
    assert (base_only - ours).abs().max() > 1e-3  # the base alone is not the policy ...
    peft = PeftModel.from_pretrained(base.transformer, unmerged / "lora")
    base.register_modules(transformer=peft.merge_and_unload())
    torch.testing.assert_close(pipeline_latents(base), ours, atol=1e-5, rtol=1e-5)  # ... base + adapter is


def test_ar_run_exports_a_transformers_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    overrides = ["model.tiny.hidden_size=32", "model.tiny.intermediate_size=64"]
    _, _, backend = make_run(run, ar_config.Recipe, "arithmetic_grpo", overrides)
    out = export_run(run, "hf")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(["12+7=", "3*4="], return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = backend.module(**ids).logits
        got = model(**ids).logits
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        a = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
        b = backend.module.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(a, b) and a.shape[1] > ids["input_ids"].shape[1]


def test_export_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="no config.yaml"):
        export_run(tmp_path, "diffusers")
    recipe = validate(diffusion_config.Recipe, load_dict("sd3_tiny_flowgrpo"))
    RunDir(tmp_path, recipe.model_dump(mode="json"), tensorboard=False)
    with pytest.raises(RecipeError, match="a diffusion run exports as --format diffusers"):
        export_run(tmp_path, "hf")
    with pytest.raises(RecipeError, match="no complete checkpoint"):
        export_run(tmp_path, "diffusers")
    assert main(["export", str(tmp_path), "--format", "hf"]) == 2  # the CLI prints the error, exit 2


@pytest.mark.slow
def test_unirl_train_then_export_samples_the_same(tmp_path: Path) -> None:
    """A run `unirl train` wrote (FlowGRPO on the tiny SD3, full weights) -> `unirl export` ->
    StableDiffusion3Pipeline.from_pretrained samples what the run's policy samples."""
    from unirl.apps.trainers.diffusion import DiffusionTrainer
    from unirl.train.checkpoint import load_checkpoint

    run = tmp_path / "run"
    assert main(["train", "sd3_tiny_flowgrpo", "rl.steps=1", "threads=1", "--run-dir", str(run)]) == 0
    assert main(["export", str(run), "--format", "diffusers", "--out", str(tmp_path / "out")]) == 0
    recipe = validate(diffusion_config.Recipe, load_dict(str(run / "config.yaml")))
    trainer = DiffusionTrainer(recipe, RunDir(tmp_path / "scratch", None, tensorboard=False))
    load_checkpoint(run / "checkpoints" / "latest", trainer.backend)
    assert trainer.backend.global_step == 1
    pipe = StableDiffusion3Pipeline.from_pretrained(tmp_path / "out", torch_dtype=torch.float32)
    torch.testing.assert_close(pipeline_latents(pipe), policy_latents(trainer.bundle), atol=1e-5, rtol=1e-5)
