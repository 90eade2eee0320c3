"""GPU shape / dtype / cost checks of the video families at their real sizes (device machine only).

Wan 2.1 T2V-1.3B and HunyuanVideo (13B) transformers and VAEs at their published configs, random
init in bf16 (the text encoders are one-layer stand-ins with the real output widths: they run once
per prompt and are not what is measured). One DanceGRPO-style step of 16 samples at 512 x 512,
33 frames: rollout (8 steps, 2 of them SDE, shared noise per group of 4) then replay + backward of
every SDE step in micro-batches (gradient checkpointing on), checking shapes, dtypes, finite
log-probs and the first-update ratio. It prints (and writes to ``$UNIRL_BENCH_OUT/video_gpu.jsonl``
when set) parameters, peak memory, rollout s and train s per 16-sample step.

    .venv/bin/python -m pytest packages/unirl-rollout/tests/test_video_gpu.py -q -s -m gpu
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.types import DiffusionSamplingParams, KOfWindow, NoiseRecipe, Sample, TextPrimitive, VideoPrimitive

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HEIGHT = WIDTH = 512
FRAMES = 33
SAMPLES, GROUP = 16, 4


def wan_1_3b() -> Any:
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    from unirl.rollout.models.tokenizers import tiny_word_tokenizer
    from unirl.rollout.models.wan import WanBundle

    with torch.device("cuda"):
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
            out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
        ).to(torch.bfloat16)  # fmt: skip
        vae = AutoencoderKLWan()  # the published Wan 2.1 VAE config (fp32, as Wan advises)
        tok = tiny_word_tokenizer(model_max_length=512)
        te = UMT5EncoderModel(
            UMT5Config(vocab_size=len(tok), d_model=4096, d_kv=64, d_ff=256, num_layers=1, num_heads=8)
        ).to(torch.bfloat16)
    pipe = WanPipeline(
        tokenizer=tok, text_encoder=te, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=transformer,
    )  # fmt: skip
    return WanBundle(pipe, max_sequence_length=512, device="cuda"), 5.0


def hunyuan_video() -> Any:
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    from unirl.rollout.models.hunyuan_video import HunyuanVideoBundle
    from unirl.rollout.models.tokenizers import tiny_word_tokenizer

    with torch.device("cuda"):
        transformer = HunyuanVideoTransformer3DModel().to(torch.bfloat16)  # the published 13B config
        vae = AutoencoderKLHunyuanVideo().to(torch.float16)
        tok, clip_tok = tiny_word_tokenizer(model_max_length=300), tiny_word_tokenizer(model_max_length=77)
        llama = LlamaModel(
            LlamaConfig(vocab_size=len(tok), hidden_size=4096, intermediate_size=256, num_hidden_layers=3,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=512)
        ).to(torch.bfloat16)  # fmt: skip
        clip = CLIPTextModel(
            CLIPTextConfig(vocab_size=len(clip_tok), hidden_size=768, intermediate_size=256, num_hidden_layers=1,
                           num_attention_heads=12, max_position_embeddings=77, bos_token_id=2, eos_token_id=3)
        ).to(torch.bfloat16)  # fmt: skip
    pipe = HunyuanVideoPipeline(
        text_encoder=llama, tokenizer=tok, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=clip, tokenizer_2=clip_tok,
    )  # fmt: skip
    template = {"template": "describe the video : {}", "crop_start": 5}
    return HunyuanVideoBundle(pipe, max_sequence_length=256, prompt_template=template, device="cuda"), 6.0


def record(row: dict[str, Any]) -> None:
    print(json.dumps(row))
    out = os.environ.get("UNIRL_BENCH_OUT")
    if out:
        with (Path(out) / "video_gpu.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("family", ["wan2.1-t2v-1.3b", "hunyuanvideo-13b"])
def test_real_size_video_step(family: str) -> None:
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    bundle, guidance = {"wan2.1-t2v-1.3b": wan_1_3b, "hunyuanvideo-13b": hunyuan_video}[family]()
    bundle.transformer.enable_gradient_checkpointing()
    n_params = sum(p.numel() for p in bundle.transformer.parameters())
    params = DiffusionSamplingParams(
        num_steps=8, guidance_scale=guidance, height=HEIGHT, width=WIDTH, num_frames=FRAMES,
        sde_strategy="dance_sde", eta=0.3, shift=bundle.default_shift, dynamic_shift=family.startswith("hunyuan"),
        sde_schedule=KOfWindow(k=2, start=0.0, end=0.5), noise=NoiseRecipe(seed=0, scope="group"),
    )  # fmt: skip
    pipe = FlowMatchPipeline(bundle, default_params=params, max_batch_size=4)
    prompts = ["a red fox running through snow", "waves crashing on a rocky shore"] * 2
    samples = [
        Sample(id=f"s{i}", group_id=f"g{i // GROUP}", inputs=[TextPrimitive(text=prompts[i // GROUP])])
        for i in range(SAMPLES)
    ]
    torch.cuda.synchronize()
    t0 = time.time()
    parts = [s.part("diffusion") for s in pipe.generate(samples, rollout_step=0)]
    torch.cuda.synchronize()
    rollout_s = time.time() - t0
    rollout_mem = torch.cuda.max_memory_allocated() / 2**30

    seg = parts[0].segment
    c, f, h, w = bundle.video_latent_shape(HEIGHT, WIDTH, FRAMES)
    assert (c, f, h, w) == (16, 9, 64, 64)
    assert seg.latents.shape == (len(seg.positions), c, f, h, w) and seg.latents.dtype == torch.float32
    video = parts[0].outputs[0]
    assert isinstance(video, VideoPrimitive) and tuple(video.frames.shape) == (FRAMES, HEIGHT, WIDTH, 3)
    assert seg.log_probs is not None and torch.isfinite(seg.log_probs).all() and len(seg.sde_indices) == 2

    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = time.time()
    worst = 0.0
    adv = torch.randn(SAMPLES, device="cuda")
    for n, j in enumerate(seg.sde_indices):
        for i in range(0, SAMPLES, 2):
            mb = parts[i : i + 2]
            rep = pipe.replay_step(mb, j)
            stored = torch.stack([p.segment.log_probs[n] for p in mb]).cuda()
            ratio = torch.exp(rep.log_prob - stored)
            worst = max(worst, float((ratio - 1).abs().max()))
            (-(ratio * adv[i : i + 2]).mean()).backward()
    torch.cuda.synchronize()
    train_s = time.time() - t0
    train_mem = torch.cuda.max_memory_allocated() / 2**30
    grads = [p.grad for p in bundle.transformer.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.bfloat16 for g in grads)
    row = dict(
        family=family, params_b=round(n_params / 1e9, 2), size=f"{HEIGHT}x{WIDTH}x{FRAMES}",
        samples=SAMPLES, rollout_s=round(rollout_s, 1), train_s=round(train_s, 1),
        rollout_peak_gib=round(rollout_mem, 1), train_peak_gib=round(train_mem, 1),
        max_abs_ratio_minus_1=worst,
    )  # fmt: skip
    record(row)
    assert worst < 1e-2  # bf16, same micro-batch shape as rollout's forward is not guaranteed: loose bound
