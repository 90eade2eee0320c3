"""One Flow-GRPO RL step on an SD3.5-medium-architecture model (random init) on one GPU.

Issue 3's benchmark: the SD3.5-medium transformer (24 layers, 24 heads x 64, joint dim 4096, dual
attention in layers 0-12, RMS qk-norm) and the SD3 VAE, random prompt embeddings of 77 + 128
tokens, 512 px, 10 steps all SDE (Flow-SDE, eta 0.7), CFG 4.5, 16 samples in 2 groups, LoRA
r32 / alpha 64 on the attention projections, training on 9 of the 10 steps with micro-batch 8,
one optimizer step. Rollout -> JPEG-incompressibility reward -> group advantages -> train.

Timed: rollout (trainside ``FlowMatchPipeline.generate``, VAE decode included, in chunks of the
training micro-batch so rollout and replay run the same shapes), reward, train (``TrainStack``
over FSDP2 with bf16 compute), and the first-update ratio deviation max |rho - 1| over every
(sample, step). ``--compile`` compiles each transformer block (regional compilation).

    python apps/benchmarks/gpu_flow_grpo_step.py --json out.json
    python apps/benchmarks/gpu_flow_grpo_step.py --tiny      # CPU smoke run (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import zlib
from collections.abc import Sequence

import numpy as np
import torch
from diffusers import AutoencoderKL, SD3Transformer2DModel

from unirl.reward.config import ServiceConfig
from unirl.reward.service import RewardService
from unirl.rollout.engines import TrainsideEngine
from unirl.rollout.models.base import text_conditions
from unirl.rollout.models.sd3 import SD3Bundle
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.train.algorithms import FlowGRPOConfig
from unirl.train.backends.fsdp import FSDPConfig
from unirl.train.geometry import BatchGeometry
from unirl.train.lora import LoRAConfig
from unirl.train.optim import AdamWConfig
from unirl.train.stack import TrainStack
from unirl.types import (
    Conditions,
    DiffusionSamplingParams,
    NoiseRecipe,
    Sample,
    TextPrimitive,
    compute_advantages,
)

SD35_MEDIUM = dict(
    sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64,
    num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
    pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)  # fmt: skip
SD3_VAE = dict(
    in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
    latent_channels=16, norm_num_groups=32, sample_size=1024, scaling_factor=1.5305, shift_factor=0.0609,
    use_quant_conv=False, use_post_quant_conv=False,
)  # fmt: skip
TINY = dict(
    sample_size=8, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=2,
    joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=16, out_channels=16,
    pos_embed_max_size=16, dual_attention_layers=(0,), qk_norm="rms_norm",
)  # fmt: skip
TINY_VAE = dict(SD3_VAE, block_out_channels=(8, 8, 8, 8), norm_num_groups=4, layers_per_block=1)
ATTENTION_PROJECTIONS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
]


class RandomPromptSD3(SD3Bundle):
    """SD3 with prompt embeddings drawn from a seed per prompt (77 CLIP + 128 T5 tokens), standing
    in for the text encoders, which the benchmark leaves out."""

    text_tokens = 77 + 128

    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        cfg = self.transformer.config
        embeds, pooled = [], []
        for t in texts:
            g = torch.Generator().manual_seed(zlib.crc32(t.encode()))
            embeds.append(torch.randn(self.text_tokens, cfg.joint_attention_dim, generator=g))
            pooled.append(torch.randn(cfg.pooled_projection_dim, generator=g))
        return text_conditions(torch.stack(embeds), torch.stack(pooled))


def build(args, device: torch.device) -> tuple[RandomPromptSD3, object]:
    pipe = SD3Bundle.tiny().pipe  # tokenizers / scheduler / tiny text encoders (unused)
    torch.manual_seed(0)
    with torch.device(device):
        pipe.transformer = SD3Transformer2DModel(**(TINY if args.tiny else SD35_MEDIUM))
        pipe.vae = AutoencoderKL(**(TINY_VAE if args.tiny else SD3_VAE))
    pipe.patch_size = pipe.transformer.config.patch_size
    bundle = RandomPromptSD3(pipe, device=device)
    if device.type == "cuda":
        bundle.vae.to(torch.bfloat16)
    if args.compile:
        for block in bundle.transformer.transformer_blocks:
            block.compile()
    lora = LoRAConfig(r=32, alpha=64, target_modules=ATTENTION_PROJECTIONS)
    backend = FSDPConfig(
        optimizer=AdamWConfig(lr=1e-4), lora=lora, grad_clip=1.0, reshard_after_forward=args.reshard
    ).build(bundle.transformer, device)
    return bundle, backend


def one_step(args, bundle, backend, engine, pipe, reward, step: int) -> dict[str, float]:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    per_group = args.samples // args.groups
    samples = [
        Sample(id=f"s{step}-{g}-{i}", group_id=f"g{g}", inputs=[TextPrimitive(text=f"prompt {g}")])
        for g in range(args.groups)
        for i in range(per_group)
    ]
    sync()
    t0 = time.perf_counter()
    with backend.gathered():
        samples = engine.generate(samples, rollout_step=step)
    sync()
    t1 = time.perf_counter()
    rewards = [r.total for r in reward.score_samples(samples, "diffusion")]
    for s, a in zip(samples, compute_advantages(rewards, [s.group_id for s in samples])):
        s.part("diffusion").advantage = float(a)
    t2 = time.perf_counter()
    algo = FlowGRPOConfig(train_fraction=0.9).build()
    stack = TrainStack(backend, algo, pipe, BatchGeometry(micro_batch_size=args.micro))
    metrics = stack.train_on([s.part("diffusion") for s in samples])
    sync()
    t3 = time.perf_counter()
    return {
        "rollout_s": t1 - t0,
        "reward_s": t2 - t1,
        "train_s": t3 - t2,
        "step_s": t3 - t0,
        "samples_per_s": args.samples / (t3 - t0),
        "ratio_dev": max(abs(metrics["ratio_max"] - 1), abs(1 - metrics["ratio_min"])),
        "trained_steps": algo.count([s.part("diffusion") for s in samples])[2] / args.samples,
        "reward_mean": float(np.mean(rewards)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps-sde", type=int, default=10, dest="num_steps")
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument(
        "--reshard", action="store_true", help="FSDP reshard_after_forward (re-gather for backward)"
    )
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="timed RL steps")
    ap.add_argument("--tiny", action="store_true", help="tiny model and sizes (CPU smoke run)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.tiny:
        args.samples, args.size, args.num_steps, args.micro = 4, 64, 3, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bundle, backend = build(args, device)
    params = DiffusionSamplingParams(
        num_steps=args.num_steps, guidance_scale=4.5, height=args.size, width=args.size, eta=0.7,
        sde_strategy="flow_sde", noise=NoiseRecipe(seed=0),
    )  # fmt: skip
    # Rollout in chunks of the training micro-batch: replay then runs the same shapes. A compiled
    # model also samples through its training graph (autograd on, training mode), so rollout and
    # replay run the same kernels and the first-update ratio stays exactly 1.
    pipe = FlowMatchPipeline(
        bundle, default_params=params, max_batch_size=args.micro, rollout_autograd=args.compile
    )
    engine = TrainsideEngine(pipe, weight_version=lambda: backend.global_step, eval_mode=not args.compile)
    reward = RewardService.local(
        ServiceConfig.model_validate(
            {"scorers": [{"name": "jpeg", "scorer": {"kind": "jpeg", "direction": "incompressibility"}}]}
        )
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    runs = [one_step(args, bundle, backend, engine, pipe, reward, k) for k in range(args.warmup + args.steps)]
    timed = runs[args.warmup :]
    res = {k: statistics.median(r[k] for r in timed) for k in timed[0]}
    res["ratio_dev"] = max(r["ratio_dev"] for r in runs)
    res["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    print(f"{args.label or ('compiled' if args.compile else 'eager')}: " + "  ".join(
        f"{k}={v:.3g}" for k, v in res.items()))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "median": res,
                       "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
