"""GPU shape / dtype / cost check of the image families at their REAL architecture size (device only).

Qwen-Image (20.4B transformer + Qwen2.5-VL-7B text encoder), FLUX.2 [klein] 4B (+ Qwen3-4B) and
Z-Image 6B (+ Qwen3-4B), randomly initialised in bf16 on one GPU (no hub: the published configs
are written out below), run one FlowGRPO step of 16 samples (4 prompts x 4) at 512 px through the
real components: the family bundle, FlowMatchPipeline (SDE rollout with CFG, per-step log-probs),
FSDPBackend (LoRA r=64 on the attention projections, gradient checkpointing) and TrainStack.
Each family prints one row for docs/benchmarks.md: parameters, peak memory of rollout and of the
whole step, rollout s and train s.

Tokenizers are the character-level one built in code (the real BPE ones need the hub), so text
sequences are longer than with the real tokenizer (Qwen-Image: ~150 tokens instead of ~30; Klein
pads to 512 either way; Z-Image: ~70 instead of ~30); the image tokens, which dominate, are real.

    pytest -m gpu packages/unirl-train/tests/test_families_gpu.py -s
    python packages/unirl-train/tests/test_families_gpu.py [qwen_image flux2_klein z_image]

Knobs (env): UNIRL_GPU_SIZE (512), UNIRL_GPU_STEPS (10 denoising steps, all SDE), UNIRL_GPU_MICRO
(4 parts per forward/backward; the rollout batches the same 4, so replay sees rollout's shapes).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from unirl.rollout.ar.tokenizer import build_char_tokenizer
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.types import (
    DiffusionSamplingParams,
    NoiseRecipe,
    Reward,
    Sample,
    TextPrimitive,
    compute_sample_advantages,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = [
    "a red fox sitting in a snowy forest at dawn, soft light",
    "a bowl of ramen on a wooden table, steam rising, photo",
    "a lighthouse on a cliff above a stormy sea, oil painting",
    "a street sign that reads OPEN 24 HOURS, neon, night",
]
DEVICE = "cuda"
"""Where the models are built and run (a CPU smoke run of the script logic may set "cpu")."""
ATTN = ["to_q", "to_k", "to_v", "to_out.0"]
JOINT = [*ATTN, "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]


def _tokenizer() -> Any:
    tok = build_char_tokenizer()
    tok.padding_side = "right"
    return tok


def _qwen3_4b(cls: Any) -> Any:
    from transformers import Qwen3Config

    return cls(
        Qwen3Config(
            hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
            rope_theta=1000000.0, tie_word_embeddings=True,
        )
    )  # fmt: skip


def qwen_image() -> tuple[Any, float, list[str]]:
    """Qwen/Qwen-Image: transformer/config.json = the class defaults (60 layers, 24 x 128 heads)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from diffusers import QwenImageTransformer2DModel as T
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from unirl.rollout.models.qwen_image import QwenImageBundle

    te = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config=dict(
                hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, max_position_embeddings=128000,
                rope_theta=1000000.0, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
            ),
            vision_config=dict(
                depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                fullatt_block_indexes=[7, 15, 23, 31],
            ),
            vocab_size=152064,
        )
    )  # fmt: skip
    sched = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
        max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential", shift=1.0,
    )  # fmt: skip
    pipe = QwenImagePipeline(
        scheduler=sched,
        vae=AutoencoderKLQwenImage(),
        text_encoder=te,
        tokenizer=_tokenizer(),
        transformer=T(),
    )
    return QwenImageBundle(pipe, device=DEVICE), 4.0, JOINT


def flux2_klein() -> tuple[Any, float, list[str]]:
    """black-forest-labs/FLUX.2-klein-base-4B (base: CFG; 5 double + 20 single blocks, 24 x 128 heads,
    joint dim 3 x 2560 of Qwen3-4B's layers 9 / 18 / 27)."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline
    from diffusers import Flux2Transformer2DModel as T
    from transformers import Qwen3ForCausalLM

    from unirl.rollout.models.flux2 import Flux2KleinBundle

    transformer = T(
        num_layers=5, num_single_layers=20, attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=7680, guidance_embeds=False,
    )  # fmt: skip
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True),
        vae=AutoencoderKLFlux2(), text_encoder=_qwen3_4b(Qwen3ForCausalLM), tokenizer=_tokenizer(),
        transformer=transformer, is_distilled=False,
    )  # fmt: skip
    return Flux2KleinBundle(pipe, device=DEVICE), 4.0, [*JOINT, "to_qkv_mlp_proj"]


def z_image() -> tuple[Any, float, list[str]]:
    """Tongyi-MAI/Z-Image: transformer = the class defaults (dim 3840, 30 layers), FLUX VAE, static shift 3.
    guidance 5 here = ZImagePipeline's guidance_scale 4."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline
    from diffusers import ZImageTransformer2DModel as T
    from transformers import Qwen3Model

    from unirl.rollout.models.z_image import ZImageBundle

    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=2, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
        use_post_quant_conv=False, sample_size=1024,
    )  # fmt: skip
    pipe = ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False),
        vae=vae, text_encoder=_qwen3_4b(Qwen3Model), tokenizer=_tokenizer(), transformer=T(),
    )  # fmt: skip
    return ZImageBundle(pipe, device=DEVICE), 5.0, ATTN


FAMILIES: dict[str, Callable[[], tuple[Any, float, list[str]]]] = {
    "qwen_image": qwen_image,
    "flux2_klein": flux2_klein,
    "z_image": z_image,
}


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def measure(name: str) -> dict[str, Any]:
    """One 16-sample FlowGRPO step of family ``name``; returns its row (and checks shapes / dtypes)."""
    from unirl.train.algorithms import FlowGRPOConfig
    from unirl.train.backends.fsdp import FSDPConfig
    from unirl.train.geometry import BatchGeometry
    from unirl.train.lora import LoRAConfig
    from unirl.train.optim import AdamWConfig
    from unirl.train.stack import TrainStack

    size = int(os.environ.get("UNIRL_GPU_SIZE", 512))
    steps = int(os.environ.get("UNIRL_GPU_STEPS", 10))
    micro = int(os.environ.get("UNIRL_GPU_MICRO", 4))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device(DEVICE):
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # build every module directly in bf16 on the GPU
        try:
            bundle, guidance, targets = FAMILIES[name]()
        finally:
            torch.set_default_dtype(default)
    build_s = time.perf_counter() - t
    n_transformer = _params(bundle.transformer)
    n_frozen = sum(_params(m) for m in bundle.frozen_modules().values())
    backend = FSDPConfig(
        optimizer=AdamWConfig(lr=1e-5),
        lora=LoRAConfig(r=64, alpha=64, target_modules=targets),
        gradient_checkpointing=True,
    ).build(bundle.transformer, DEVICE)
    params = DiffusionSamplingParams(
        num_steps=steps, guidance_scale=guidance, height=size, width=size, eta=0.7, sde_strategy="flow_sde",
        dynamic_shift=True, noise=NoiseRecipe(seed=0),
    )  # fmt: skip
    pipe = FlowMatchPipeline(bundle, default_params=params, max_batch_size=micro)
    samples = [
        Sample(id=f"p{g}-{i}", group_id=f"p{g}", inputs=[TextPrimitive(text=p)])
        for g, p in enumerate(PROMPTS)
        for i in range(4)
    ]
    mem_loaded = torch.cuda.max_memory_allocated()

    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.no_grad(), backend.gathered():
        pipe.generate(samples, rollout_step=0)
    torch.cuda.synchronize()
    rollout_s = time.perf_counter() - t
    mem_rollout = torch.cuda.max_memory_allocated()

    parts = [s.part("diffusion") for s in samples]
    seg = parts[0].segment
    c, h, w = bundle.latent_shape(size, size)
    assert seg.latents.shape == (len(seg.positions), c, h, w) and seg.latents.dtype == torch.float32
    assert seg.log_probs.shape == (steps,) and torch.isfinite(seg.log_probs).all()
    assert parts[0].conditions["prompt_embeds"].dtype == torch.bfloat16
    assert "negative_prompt_embeds" in parts[0].conditions.tensors  # CFG on
    img = parts[0].outputs[0].pixels
    assert img.shape == (size, size, 3) and img.dtype == torch.uint8
    g = torch.Generator().manual_seed(0)
    for p in parts:  # any rewards do: this measures cost, not learning
        r = float(torch.rand((), generator=g))
        p.reward = Reward(total=r, components={"random": r})
    compute_sample_advantages(samples, "diffusion")

    stack = TrainStack(
        backend, FlowGRPOConfig().build(), pipe, BatchGeometry(micro_batch_size=micro, mini_batch_size=16)
    )
    torch.cuda.synchronize()
    t = time.perf_counter()
    metrics = stack.train_on(parts)
    torch.cuda.synchronize()
    train_s = time.perf_counter() - t
    mem_peak = torch.cuda.max_memory_allocated()
    assert metrics.get("skipped_nonfinite", 0) == 0, metrics
    row = {
        "family": name,
        "transformer_params_B": round(n_transformer / 1e9, 3),
        "frozen_params_B": round(n_frozen / 1e9, 3),
        "image_tokens": bundle.image_seq_len(size, size),
        "text_tokens": int(parts[0].conditions["prompt_embeds"].shape[0]),
        "size": size,
        "steps": steps,
        "micro_batch": micro,
        "build_s": round(build_s, 1),
        "mem_loaded_GiB": round(mem_loaded / 2**30, 1),
        "mem_rollout_GiB": round(mem_rollout / 2**30, 1),
        "mem_peak_GiB": round(mem_peak / 2**30, 1),
        "rollout_s": round(rollout_s, 1),
        "train_s": round(train_s, 1),
        "ratio_mean": metrics.get("ratio_mean"),
        "ratio_max": metrics.get("ratio_max"),
    }
    assert all(math.isfinite(v) for v in (rollout_s, train_s))
    del stack, pipe, backend, bundle, parts, samples
    torch.cuda.empty_cache()
    return row


@pytest.mark.parametrize("name", list(FAMILIES))
def test_real_size_family_step(name: str) -> None:
    row = measure(name)
    print(json.dumps(row))
    assert row["mem_peak_GiB"] < 140


def markdown(row: dict[str, Any]) -> str:
    return (
        f"| {row['family']} | {row['transformer_params_B']}B (+{row['frozen_params_B']}B frozen) | "
        f"{row['mem_peak_GiB']} GiB (rollout {row['mem_rollout_GiB']}) | {row['rollout_s']} s | "
        f"{row['train_s']} s |"
    )


if __name__ == "__main__":
    names = sys.argv[1:] or list(FAMILIES)
    rows = [measure(n) for n in names]
    print("| family | parameters | memory (512 px, 16 samples) | rollout s | train s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(markdown(r))
    print(json.dumps(rows, indent=1))
