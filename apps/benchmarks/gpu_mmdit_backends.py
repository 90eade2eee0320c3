"""A flow-matching train step of an SD3-medium-sized MMDiT on each train backend (FSDP2, megatron-core), one GPU.

Issue 18's image-side comparison. The model is diffusers' ``SD3Transformer2DModel`` at SD3-medium's
shape (24 joint blocks, 24 heads x 64 = 1536 wide, 16 latent channels, patch 2, T5-sized 4096-wide
text states, 2048-wide pooled text), random init from seed 0 with the weights moved off the
adaLN-Zero init (so every block computes something). The batch: ``--batch`` latents of
``--latent`` x ``--latent`` (64: a 512 x 512 image, 1024 image tokens) with ``--text-tokens`` text
tokens (333: SD3's 77 CLIP + 256 T5), random timesteps; the loss is the flow-matching MSE of the
velocity against a random target, the work of one Flow-GRPO / DiffusionNFT / SFT replay step.

For each backend of ``--backends`` (the first is the baseline), in turn: the model is rebuilt from
the same seed, the backend is built over it (``precision`` default: bf16 compute, fp32 master
weights and AdamW moments, on both), the velocity at the initial weights is compared with the
baseline's (``max |dv|``: the backends compute the same function), one step is a warm-up and
``--steps`` more are timed between two ``torch.cuda.synchronize``. Peak memory is
``torch.cuda.max_memory_allocated`` from before the model is built to the end of its steps.

Model FLOPs of a step (forward + backward = 3 x forward; the adaLN modulations, embedders and
output layer, all per sample or tiny, not counted)::

    3 * B * L * [ 2 * (12 * D^2) * (N_img + N_txt) + 4 * D * (N_img + N_txt)^2 ]

(q, k, v, out and the 4x MLP per stream: 12 D^2 weights per token; QK^T and AV over the joint
sequence; the last block's text stream has only q, k, v: counted as the others, < 1% high).
MFU = model FLOPs / (step seconds x 989 TFLOP/s, the dense bf16 peak of an H100 / H200).

    python apps/benchmarks/gpu_mmdit_backends.py --backends fsdp megatron --steps 10 --json out.json
    python apps/benchmarks/gpu_mmdit_backends.py --tiny --backends fsdp megatron   # CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from typing import Any

import torch

PEAK_FLOPS = 989e12


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    d = args.heads * args.head_dim
    m = SD3Transformer2DModel(
        sample_size=args.latent,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=args.layers,
        attention_head_dim=args.head_dim,
        num_attention_heads=args.heads,
        joint_attention_dim=args.text_dim,
        caption_projection_dim=d,
        pooled_projection_dim=args.pooled_dim,
        pos_embed_max_size=args.latent // 2,
    )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return m


def make_batch(args: argparse.Namespace, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    b = args.batch
    cpu = {
        "hidden_states": torch.randn(b, 16, args.latent, args.latent, generator=g),
        "encoder_hidden_states": torch.randn(b, args.text_tokens, args.text_dim, generator=g),
        "pooled_projections": torch.randn(b, args.pooled_dim, generator=g),
        "timestep": torch.rand(b, generator=g) * 1000,
        "target": torch.randn(b, 16, args.latent, args.latent, generator=g),
    }
    return {k: v.to(device) for k, v in cpu.items()}


def model_flops(args: argparse.Namespace) -> float:
    d = args.heads * args.head_dim
    s = (args.latent // 2) ** 2 + args.text_tokens
    return 3 * args.batch * args.layers * (2 * 12 * d * d * s + 4 * d * s * s)


def build(kind: str, model: torch.nn.Module, device: torch.device, precision: str) -> Any:
    from unirl.train.optim import AdamWConfig

    opt = AdamWConfig(lr=1e-4)
    prec = {"param_dtype": precision}
    if kind == "fsdp":
        from unirl.train.backends.fsdp import FSDPConfig

        return FSDPConfig(optimizer=opt, precision=prec).build(model, device)
    from unirl.train.backends.megatron import MegatronConfig

    return MegatronConfig(optimizer=opt, precision=prec).build(model, device)


def velocity(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    x = {k: v for k, v in batch.items() if k != "target"}
    return module(**x, return_dict=False)[0]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_backend(
    kind: str, args: argparse.Namespace, device: torch.device, ref_v: torch.Tensor | None
) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    model = make_model(args).to(device)
    backend = build(kind, model, device, args.precision)
    module = backend.module
    batch = make_batch(args, device)
    with torch.no_grad():
        v0 = velocity(module, batch).float()
    out: dict[str, Any] = {"backend": kind}
    if ref_v is not None:
        out["max_dv"] = float((v0 - ref_v).abs().max())
        out["max_v"] = float(ref_v.abs().max())

    def step() -> float:
        loss = (velocity(module, batch).float() - batch["target"]).square().mean()
        backend.backward(loss)
        backend.step()
        return float(loss)

    out["first_loss"] = step()
    times = []
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    out["step_s"] = statistics.median(times)
    out["step_s_range"] = [min(times), max(times)]
    out["samples_per_s"] = args.batch / out["step_s"]
    out["mfu"] = model_flops(args) / (out["step_s"] * PEAK_FLOPS)
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    out["params_m"] = sum(p.numel() for p in module.parameters()) / 1e6
    return {**out, "_v0": v0}  # the backend and model are freed as this frame ends


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", nargs="+", default=["fsdp", "megatron"], choices=["fsdp", "megatron"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--latent", type=int, default=64)
    ap.add_argument("--text-tokens", type=int, default=333)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--text-dim", type=int, default=4096)
    ap.add_argument("--pooled-dim", type=int, default=2048)
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="compute dtype of both backends (auto: bf16 on CUDA); fp32 also turns TF32 off")  # fmt: skip
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch (CPU smoke run)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.tiny:
        args.__dict__.update(batch=2, latent=8, text_tokens=5, layers=2, heads=2, head_dim=8, text_dim=16,
                             pooled_dim=16, steps=min(args.steps, 2))  # fmt: skip
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.precision != "fp32"
    rows, ref = [], None
    for kind in args.backends:
        r = run_backend(kind, args, device, ref)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        v0 = r.pop("_v0")
        ref = v0 if ref is None else ref
        base = rows[0]["step_s"] if rows else r["step_s"]
        r["vs_baseline"] = r["step_s"] / base
        rows.append(r)
        print(json.dumps(r), flush=True)
    print(f"model TFLOP/step {model_flops(args) / 1e12:.1f}")
    if args.json:
        name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "device": name, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
